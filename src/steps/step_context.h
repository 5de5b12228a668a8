/*
 * step_context.h -- the attempt context a running step body sees (docs/steps.md, "Keys" and "How a
 * step behaves").
 */
#ifndef DS_STEP_CONTEXT_H
#define DS_STEP_CONTEXT_H

#include "base/compat.h"

typedef struct StepContext
{
	char	   *run_id;
	char	   *step_id;
	int			attempt;		/* grows across re-arms: never reused */
	int			max_attempts;	/* the last attempt number this arming allows */
} StepContext;

extern void ds_step_context_init_module(void);

/* Push before a body runs, pop after, on success and on error alike. */
extern void ds_step_context_push(const char *run_id, const char *step_id, int attempt,
								 int max_attempts);
extern void ds_step_context_pop(void);

/* Is this step executing in this backend right now (a body calling its own step)? */
extern bool ds_step_context_is_executing(const char *run_id, const char *step_id);

/* The innermost executing context, or NULL when no step body executes. */
extern const StepContext *ds_step_context_innermost(void);

#endif							/* DS_STEP_CONTEXT_H */
