/*
 * classify.h -- the outcome classes of an attempt and the SQLSTATE rules behind them (docs/steps.md, "Outcome classes").
 */
#ifndef DS_CLASSIFY_H
#define DS_CLASSIFY_H

#include "base/compat.h"
#include "utils/array.h"

typedef enum AttemptClass
{
	ATTEMPT_COMPLETED,
	ATTEMPT_RETRYABLE,
	ATTEMPT_CORRECTABLE,
	ATTEMPT_PERMANENT,
	ATTEMPT_CANCELLED,			/* stopped by ds_cancel_step(): the step is
								 * cancelled */
	ATTEMPT_UNCERTAIN			/* an HTTP request that may have had its
								 * effect, and may not be sent again: the step
								 * is uncertain until a person settles it */
} AttemptClass;

/* A step's retry_on / fail_on overrides, parsed. */
typedef struct ClassOverrides
{
	int			n_retry;
	int		   *retry_on;		/* SQLSTATE codes; a class is stored as its
								 * category code */
	bool	   *retry_is_class;
	int			n_fail;
	int		   *fail_on;
	bool	   *fail_is_class;
	bool		timeout_fails;	/* on_timeout => 'fail' */
} ClassOverrides;

extern const char *ds_attempt_class_name(AttemptClass cls);

/* Validate a retry_on / fail_on argument (22023 naming the bad entry); NULL array is allowed. */
extern void ds_parse_sqlstate_list(ArrayType *arr, const char *argname, int *n, int **codes,
								   bool **is_class);
extern AttemptClass ds_classify_sqlstate(int sqlerrcode, const ClassOverrides *overrides);

/*
 * ds_retry_after() hands its delay to the classifier through this backend-local slot; it is
 * cleared before every attempt so that only a delay raised by that attempt can count.
 */
extern void ds_retry_after_clear(void);
extern bool ds_retry_after_get(int64 *usecs);

#endif							/* DS_CLASSIFY_H */
