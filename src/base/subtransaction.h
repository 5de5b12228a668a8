/*
 * subtransaction.h -- code run in an internal subtransaction of the current transaction, whose
 * error is caught and rolled back with it (subtransaction.c).
 *
 * The pattern of PL/pgSQL's exception blocks and of PL/Python's subtransactions
 * (PLy_spi_subtransaction_begin/commit/abort in plpy_spi.c), in one place:
 *
 *		Subtransaction sub;
 *
 *		ds_subtransaction_begin(&sub);
 *		PG_TRY();
 *		{
 *			... the code whose error must not end the transaction ...
 *			ds_subtransaction_commit(&sub);
 *		}
 *		PG_CATCH();
 *		{
 *			ErrorData  *edata = ds_subtransaction_rollback(&sub);
 *			... the error, in the caller's memory context ...
 *		}
 *		PG_END_TRY();
 *
 * The code runs in the caller's memory context (not the subtransaction's, which goes with it),
 * and both ends leave the caller's memory context and resource owner current again. What must
 * happen before the error is copied (a timer disarmed, so that no second cancel escapes the
 * catch block) goes in the catch block before ds_subtransaction_rollback().
 */
#ifndef DS_SUBTRANSACTION_H
#define DS_SUBTRANSACTION_H

#include "base/compat.h"
#include "utils/elog.h"
#include "utils/palloc.h"
#include "utils/resowner.h"

/* What a subtransaction returns to: the caller's memory context and resource owner. */
typedef struct Subtransaction
{
	MemoryContext caller_cxt;
	ResourceOwner caller_owner;
} Subtransaction;

/* Begin an internal subtransaction; the caller's memory context stays current. */
extern void ds_subtransaction_begin(Subtransaction *sub);

/* Last in the PG_TRY block: commit the subtransaction, back to the caller's context and owner. */
extern void ds_subtransaction_commit(Subtransaction *sub);

/*
 * In the PG_CATCH block: the error, copied into the caller's memory context and flushed; the
 * subtransaction rolled back (its writes, its SETs, its SPI connections, a role switch), back to
 * the caller's context and owner.
 */
extern ErrorData *ds_subtransaction_rollback(Subtransaction *sub);

#endif							/* DS_SUBTRANSACTION_H */
