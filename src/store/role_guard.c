/*
 * role_guard.c -- DROP ROLE warns about the unfinished steps the dropped roles own, and deletes
 * their idempotency keys.
 *
 * A step runs only as the role that created it, and the worker fails it closed once that role
 * is gone. Nothing in the catalogs ties a role to its steps (the owner is a column, not a
 * dependency), so DROP ROLE succeeds without a word. This hook lets the DROP ROLE run, then
 * counts the unfinished steps each dropped role owns in the current database and warns about
 * them. It cannot see the steps of other databases, and it acts only where the library is
 * loaded (shared_preload_libraries loads it in every session).
 *
 * The user running DROP ROLE need not be able to read durable_steps.steps: the count is one of
 * the extension's own statements (ds_store_spi_begin), run as the table's owner with every name
 * and operator qualified.
 */
#include "base/compat.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "store/role_guard.h"
#include "store/store_relations.h"
#include "store/step_store.h"

/* the steps that may still run: every status but succeeded, failed and cancelled */
#define UNFINISHED_STEPS_BY_OWNER \
	"SELECT owner::pg_catalog.oid, pg_catalog.count(*) FROM durable_steps.steps" \
	" WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1)" \
	" AND status OPERATOR(pg_catalog.<>) ALL ('{succeeded,failed,cancelled}'::pg_catalog.text[])" \
	" GROUP BY 1"

typedef struct DroppedRole
{
	Oid			oid;
	char	   *name;
	int64		unfinished;
} DroppedRole;

static ProcessUtility_hook_type prev_process_utility = NULL;

/* The roles a DROP ROLE names that exist now (IF EXISTS may name others). */
static DroppedRole *
roles_to_drop(DropRoleStmt *stmt, int *n)
{
	DroppedRole *roles = palloc0(sizeof(DroppedRole) * Max(list_length(stmt->roles), 1));
	ListCell   *lc;

	*n = 0;
	foreach(lc, stmt->roles)
	{
		RoleSpec   *spec = lfirst(lc);
		Oid			oid;

		/* DROP ROLE refuses CURRENT_USER and the like itself */
		if (spec->roletype != ROLESPEC_CSTRING)
			continue;
		oid = get_role_oid(spec->rolename, true);
		if (!OidIsValid(oid))
			continue;
		roles[*n].oid = oid;
		roles[*n].name = pstrdup(spec->rolename);
		(*n)++;
	}
	return roles;
}

/* The roles' OIDs as an oid[] Datum, the parameter of the statements below. */
static Datum
role_oid_array(DroppedRole *roles, int n)
{
	Datum	   *oids = palloc(sizeof(Datum) * n);

	for (int i = 0; i < n; i++)
		oids[i] = ObjectIdGetDatum(roles[i].oid);
	return PointerGetDatum(construct_array(oids, n, OIDOID, sizeof(Oid), true, TYPALIGN_INT));
}

/* Fill in each role's count of unfinished steps, reading the table as its owner. */
static void
count_unfinished_steps(DroppedRole *roles, int n)
{
	Oid			argtypes[1] = {OIDARRAYOID};
	Datum		args[1] = {role_oid_array(roles, n)};
	StoreSpi	spi;
	int			rc;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_with_args(UNFINISHED_STEPS_BY_OWNER, 1, argtypes, args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "counting the dropped roles' steps failed: %s", SPI_result_code_string(rc));
	for (uint64 row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];
		bool		isnull;
		Oid			owner = DatumGetObjectId(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1,
														   &isnull));
		int64		count = DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2,
														&isnull));

		for (int i = 0; i < n; i++)
			if (roles[i].oid == owner)
				roles[i].unfinished = count;
	}
	ds_store_spi_end(&spi);
}

/*
 * Delete the dropped roles' idempotency keys: a role created later may get the same OID, and
 * must not be answered the stored responses of another (docs/idempotent-requests.md).
 */
static void
delete_idempotency_keys(DroppedRole *roles, int n)
{
	Oid			argtypes[1] = {OIDARRAYOID};
	Datum		args[1] = {role_oid_array(roles, n)};
	StoreSpi	spi;
	int			rc;

	ds_store_spi_begin(&spi);
	rc = SPI_execute_with_args("DELETE FROM durable_steps.idempotency_keys"
							   " WHERE owner::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1)",
							   1, argtypes, args, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "deleting the dropped roles' idempotency keys failed: %s",
			 SPI_result_code_string(rc));
	ds_store_spi_end(&spi);
}

/* Warn once for each dropped role that owned unfinished steps. */
static void
warn_about_orphaned_steps(DroppedRole *roles, int n)
{
	char	   *database = get_database_name(MyDatabaseId);

	for (int i = 0; i < n; i++)
	{
		if (roles[i].unfinished == 0)
			continue;
		ereport(WARNING,
				(errmsg_plural("role \"%s\" owns %lld unfinished durable step in database \"%s\"",
							   "role \"%s\" owns %lld unfinished durable steps in database \"%s\"",
							   roles[i].unfinished,
							   roles[i].name, (long long) roles[i].unfinished, database),
				 errdetail_plural("A step runs only as the role that created it: the worker will fail this step when it runs it.",
								  "A step runs only as the role that created it: the worker will fail these steps when it runs them.",
								  roles[i].unfinished),
				 errhint("To keep a role's steps, reassign them before dropping the role (as a superuser: UPDATE durable_steps.steps SET owner = 'other_role' WHERE owner = %s); in a transaction block, roll back first.",
						 quote_literal_cstr(quote_identifier(roles[i].name)))));
	}
}

/* ProcessUtility hook: run the statement, then warn after a DROP ROLE that succeeded. */
static void
role_guard_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
						   ProcessUtilityContext context, ParamListInfo params,
						   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	DroppedRole *roles = NULL;
	int			n = 0;

	/* the roles' OIDs, while they still exist */
	if (IsA(pstmt->utilityStmt, DropRoleStmt))
		roles = roles_to_drop((DropRoleStmt *) pstmt->utilityStmt, &n);

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
							 dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
								dest, qc);

	/* only a DROP ROLE that succeeded warns */
	if (n > 0 && ds_store_installed())
	{
		count_unfinished_steps(roles, n);
		warn_about_orphaned_steps(roles, n);
		delete_idempotency_keys(roles, n);
	}
}

void
ds_role_guard_init_module(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = role_guard_process_utility;
}
