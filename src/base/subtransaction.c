/*
 * subtransaction.c -- code run in an internal subtransaction whose error is caught
 * (subtransaction.h). One copy of the steps every caller must take in this order: the step
 * bodies (step_exec.c), the outcome hooks (step_hooks.c) and the HTTP worker's outcomes
 * (http_outcomes.c).
 */
#include "base/compat.h"

#include "access/xact.h"
#include "utils/memutils.h"

#include "base/subtransaction.h"

void
ds_subtransaction_begin(Subtransaction *sub)
{
	sub->caller_cxt = CurrentMemoryContext;
	sub->caller_owner = CurrentResourceOwner;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(sub->caller_cxt);
}

void
ds_subtransaction_commit(Subtransaction *sub)
{
	ReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(sub->caller_cxt);
	CurrentResourceOwner = sub->caller_owner;
}

ErrorData *
ds_subtransaction_rollback(Subtransaction *sub)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(sub->caller_cxt);
	edata = CopyErrorData();
	FlushErrorState();
	RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(sub->caller_cxt);
	CurrentResourceOwner = sub->caller_owner;
	return edata;
}
