/*
 * citus_commit.c -- two-phase commit asked of Citus by a transaction that writes the extension's
 * records.
 *
 * With Citus, a step's body may write distributed tables, whose rows live on other nodes. Citus
 * ends the transactions it opened there from its XACT_EVENT_PRE_COMMIT callback, before this
 * node writes its commit record, and in one phase unless something asked for two: then a crash
 * of this node between the two commits keeps the step's effect on the other nodes and loses the
 * step's record with this node's transaction, and the step runs again. Asked for two phases,
 * Citus prepares the other nodes' transactions instead and commits them after this node's
 * commit; its recovery (recover_prepared_transactions, run by its maintenance daemon) commits or
 * rolls back what a crash left prepared by whether this node's transaction committed. So every
 * write of a step's or a run's record asks for it (direct_write.c calls this): the record and
 * the effect commit or vanish together.
 *
 * durable_steps neither links to Citus nor requires it: the request is Citus's own
 * Use2PCForCoordinatedTransaction(), found by name among the symbols already loaded, which only
 * sets a flag that Citus clears at the end of every transaction and reads at PRE_COMMIT (a
 * transaction that wrote no other node commits as before). A Citus whose internal functions are
 * hidden (built by the PGXS of 16 or later as it is by default, compat.h; its SQL-callable ones
 * stay exported) cannot be asked: the backend warns once, and its steps run without the
 * guarantee.
 */
#include "base/compat.h"

#include <dlfcn.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "store/citus_commit.h"

typedef void (*CitusUse2PC) (void);

typedef enum CitusState
{
	CITUS_UNKNOWN,				/* not looked for yet in this backend */
	CITUS_ABSENT,				/* not loaded */
	CITUS_FOUND,				/* use_2pc is Citus's function */
	CITUS_HIDDEN				/* loaded, but the function could not be found */
} CitusState;

static CitusState citus_state = CITUS_UNKNOWN;
static CitusUse2PC use_2pc = NULL;

/*
 * durable_steps.citus_two_phase_commit: on unless a superuser turns it off to measure what the
 * guarantee costs (bench/citus_bench.sh) or to show what it prevents (TAP 086).
 */
static bool two_phase_commit = true;

void
ds_citus_commit_init_module(void)
{
	DefineCustomBoolVariable("durable_steps.citus_two_phase_commit",
							 "Asks Citus for two-phase commit in every transaction that writes a step's or a run's record.",
							 "Off, a crash of the coordinator as it commits may repeat a step whose body wrote distributed tables. For measurements only.",
							 &two_phase_commit,
							 true,
							 PGC_SUSET,
							 GUC_NOT_IN_SAMPLE,
							 NULL, NULL, NULL);
}

static void
find_citus(void)
{
	/*
	 * Loaded by the postmaster with RTLD_GLOBAL (Citus can be loaded no other
	 * way): its symbols are found among those already loaded. Its
	 * SQL-callable functions are exported however it was built, so one of
	 * them tells a server without Citus from a Citus that hides the function
	 * asked for.
	 */
	if (dlsym(RTLD_DEFAULT, "pg_finfo_citus_version") == NULL)
	{
		citus_state = CITUS_ABSENT;
		return;
	}

	/*
	 * The function asked for. Not load_external_function, which finds a
	 * library by its file: after an upgrade of Citus's package before a
	 * restart, the file is a new one, and loading it again fails every step's
	 * write.
	 */
	use_2pc = (CitusUse2PC) dlsym(RTLD_DEFAULT, "Use2PCForCoordinatedTransaction");
	if (use_2pc != NULL)
	{
		citus_state = CITUS_FOUND;
		return;
	}
	citus_state = CITUS_HIDDEN;
	ereport(WARNING,
			(errcode(ERRCODE_WARNING),
			 errmsg("durable_steps cannot ask Citus for two-phase commit: its library exports no Use2PCForCoordinatedTransaction()"),
			 errdetail("A step whose body writes distributed tables may run again after a crash of this node as it commits."),
			 errhint("%s", DS_CITUS_HIDDEN_SYMBOLS_HINT)));
}

void
ds_citus_use_two_phase_commit(void)
{
	if (!two_phase_commit)
		return;
	if (citus_state == CITUS_UNKNOWN)
		find_citus();
	if (citus_state == CITUS_FOUND)
		use_2pc();
}
