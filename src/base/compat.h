/*
 * compat.h -- every difference between the supported PostgreSQL majors, in one place.
 *
 * durable_steps supports PostgreSQL 15, 16, 17 and 18, and builds on 19 beta; each is built and
 * tested in CI (README, "Requirements"). Older majors are refused at build time rather than
 * half-working. No other file tests PG_VERSION_NUM: a call whose signature or name differs
 * between majors is made through the macro or inline function here, written for the newest
 * major's meaning, in the manner of pgvector's and TimescaleDB's compat headers.
 *
 * The macros expand to calls whose declarations the using file includes (executor/executor.h,
 * access/genam.h, utils/acl.h, ...): this header includes only what its inline functions need.
 */
#ifndef DS_COMPAT_H
#define DS_COMPAT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "durable_steps requires PostgreSQL 15 or later"
#endif

#include "nodes/pg_list.h"
#include "storage/lock.h"
#include "utils/jsonb.h"

/*
 * The module's magic block. 18 lets it carry the extension's name and version, which
 * pg_get_loaded_modules() shows.
 */
#if PG_VERSION_NUM >= 180000
#define DS_MODULE_MAGIC PG_MODULE_MAGIC_EXT(.name = "durable_steps", .version = "0.1.0")
#else
#define DS_MODULE_MAGIC PG_MODULE_MAGIC
#endif

/*
 * A function that never returns: 18 spells it as the C11 specifier before the declaration
 * (pg_noreturn) and removed pg_attribute_noreturn(); before 18 the attribute, which GCC and
 * clang also accept in that position.
 */
#if PG_VERSION_NUM < 180000
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * A GUC check hook's `extra`: 16 frees it with guc_free(), so it must come from guc_malloc();
 * before 16 it is free()d and must come from malloc(). Either returns NULL when out of memory
 * (guc_malloc at LOG level reports it first).
 */
#if PG_VERSION_NUM >= 160000
#define ds_guc_extra_malloc(size) guc_malloc(LOG, (size))
#else
#define ds_guc_extra_malloc(size) malloc(size)
#endif

/*
 * The printf conversion of a uint64 in hexadecimal: 18 made uint64 the C99 uint64_t, whose
 * <inttypes.h> macro is the one to use, and removed INT64_MODIFIER, which names the length
 * modifier of the type that uint64 was before.
 */
#if PG_VERSION_NUM >= 180000
#define DS_UINT64_HEX PRIx64
#else
#define DS_UINT64_HEX INT64_MODIFIER "x"
#endif

/* This backend's local transaction id: 17 moved it into MyProc->vxid. */
#if PG_VERSION_NUM >= 170000
#define DS_MY_LXID (MyProc->vxid.lxid)
#else
#define DS_MY_LXID (MyProc->lxid)
#endif

/* This process's number among the PGPROCs: 17 replaced MyProc->pgprocno with MyProcNumber. */
#if PG_VERSION_NUM >= 170000
#define DS_MY_PROC_NUMBER MyProcNumber
#else
#define DS_MY_PROC_NUMBER (MyProc->pgprocno)
#endif

/* Is this process a background worker? 17 replaced the flag with a process-type test. */
#if PG_VERSION_NUM >= 170000
#define DS_AM_BACKGROUND_WORKER AmBackgroundWorkerProcess()
#else
#define DS_AM_BACKGROUND_WORKER IsBackgroundWorker
#endif

/* EXECUTE permission on a function: 16 folded pg_proc_aclcheck() into object_aclcheck(). */
#if PG_VERSION_NUM >= 160000
#define ds_proc_aclcheck(proc_oid, role_oid, mode) \
	object_aclcheck(ProcedureRelationId, (proc_oid), (role_oid), (mode))
#else
#define ds_proc_aclcheck(proc_oid, role_oid, mode) pg_proc_aclcheck((proc_oid), (role_oid), (mode))
#endif

/* A privilege on a schema: 16 folded pg_namespace_aclcheck() into object_aclcheck(). */
#if PG_VERSION_NUM >= 160000
#define ds_namespace_aclcheck(nsp_oid, role_oid, mode) \
	object_aclcheck(NamespaceRelationId, (nsp_oid), (role_oid), (mode))
#else
#define ds_namespace_aclcheck(nsp_oid, role_oid, mode) \
	pg_namespace_aclcheck((nsp_oid), (role_oid), (mode))
#endif

/*
 * An index scan without instrumentation: 18 added the instrumentation argument, 19 the scan
 * option flags.
 */
#if PG_VERSION_NUM >= 190000
#define ds_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys), 0)
#elif PG_VERSION_NUM >= 180000
#define ds_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define ds_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * The range table of a minimal executor state whose one relation is `rte` (a direct write, as
 * the logical replication apply worker sets one up). 16 keeps permissions apart from the range
 * table entries, and an entry without its RTEPermissionInfo is refused when the executor looks
 * at the updated columns; 18 also takes the relations left after pruning (here: the one).
 * Needs executor/executor.h, and parser/parse_relation.h from 16 on, at the caller.
 */
#if PG_VERSION_NUM >= 180000
#define ds_exec_init_range_table(estate, rte) \
	do { \
		List	   *ds_perminfos_ = NIL; \
		addRTEPermissionInfo(&ds_perminfos_, (rte)); \
		ExecInitRangeTable((estate), list_make1(rte), ds_perminfos_, bms_make_singleton(1)); \
	} while (0)
#elif PG_VERSION_NUM >= 160000
#define ds_exec_init_range_table(estate, rte) \
	do { \
		List	   *ds_perminfos_ = NIL; \
		addRTEPermissionInfo(&ds_perminfos_, (rte)); \
		ExecInitRangeTable((estate), list_make1(rte), ds_perminfos_); \
	} while (0)
#else
#define ds_exec_init_range_table(estate, rte) ExecInitRangeTable((estate), list_make1(rte))
#endif

/* An EvalPlanQual state for a simple update: 16 added the result relations (none here). */
#if PG_VERSION_NUM >= 160000
#define ds_eval_plan_qual_init(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1, NIL)
#else
#define ds_eval_plan_qual_init(epqstate, estate) \
	EvalPlanQualInit((epqstate), (estate), NULL, NIL, -1)
#endif

/*
 * Building a jsonb value token by token: 19 keeps the parse stack and the result in a
 * JsonbInState, where pushJsonbValue() returned the value so far before. ds_jsonb_push() returns
 * it on every major (complete after the closing token of the outermost container).
 */
#if PG_VERSION_NUM >= 190000
typedef JsonbInState DsJsonbBuilder;

static inline JsonbValue *
ds_jsonb_push(DsJsonbBuilder *b, JsonbIteratorToken tok, JsonbValue *v)
{
	pushJsonbValue(b, tok, v);
	return b->result;
}
#else
typedef struct DsJsonbBuilder
{
	JsonbParseState *state;
	JsonbValue *result;
} DsJsonbBuilder;

static inline JsonbValue *
ds_jsonb_push(DsJsonbBuilder *b, JsonbIteratorToken tok, JsonbValue *v)
{
	b->result = pushJsonbValue(&b->state, tok, v);
	return b->result;
}
#endif

/* Does this backend hold `tag` in exactly `mode`? LockHeldByMe() took an "or stronger" flag in 17. */
static inline bool
ds_lock_held_by_me(const LOCKTAG *tag, LOCKMODE mode)
{
#if PG_VERSION_NUM >= 170000
	return LockHeldByMe(tag, mode, false);
#else
	return LockHeldByMe(tag, mode);
#endif
}

/*
 * What to do about a Citus whose Use2PCForCoordinatedTransaction() cannot be found
 * (store/citus_commit.c). From 16, PGXS builds a module with -fvisibility=hidden, so a Citus
 * built for 16 exports only its SQL-callable functions; up to 15 every function is visible.
 */
#if PG_VERSION_NUM >= 160000
#define DS_CITUS_HIDDEN_SYMBOLS_HINT \
	"Build Citus with its functions visible (make CFLAGS_SL_MODULE=, as scripts/citus-build does); see docs/citus.md."
#else
#define DS_CITUS_HIDDEN_SYMBOLS_HINT "Install a Citus built for this PostgreSQL; see docs/citus.md."
#endif

#endif							/* DS_COMPAT_H */
