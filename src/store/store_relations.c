/*
 * store_relations.c -- the root of the storage layer: the extension's tables, looked up once per
 * backend, and the relcache callback that makes the storage modules look them up again (the
 * replay cache, above them, registers its own).
 *
 * The storage modules read and write rows below the SQL level (index probes, direct writes):
 * that is only right for the tables the install script creates. So the lookup also checks what
 * they rely on: every table is a heap table, and has every column of the layouts described in
 * step_store.h, which registers their names. The columns' attribute numbers are looked up here,
 * once, for every module.
 *
 * Those layouts are this library's version's: the tables of an extension installed at another
 * version (the library of a new release loaded before ALTER EXTENSION durable_steps UPDATE ran)
 * may lack a column or mean another thing by one. So the lookup also compares the installed
 * version with the library's, and refuses to read or write anything while they differ (DS426).
 */
#include "base/compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "base/ds_errcodes.h"
#include "store/store_relations.h"

static bool relations_valid = false;
static StoreRelations relations;

/* the registered layouts (ds_store_register_columns) */
static const char *const *step_column_names = NULL;
static int	n_step_columns = 0;
static const char *const *attempt_column_names = NULL;
static int	n_attempt_columns = 0;

void
ds_store_register_columns(StoreTable table, const char *const *names, int n)
{
	if (n > DS_STORE_MAX_COLUMNS)
		elog(ERROR, "a table of durable_steps has more than %d columns", DS_STORE_MAX_COLUMNS);
	if (table == STORE_TABLE_STEPS)
	{
		step_column_names = names;
		n_step_columns = n;
	}
	else
	{
		attempt_column_names = names;
		n_attempt_columns = n;
	}
}

/* Any relation changed (DROP/CREATE EXTENSION, ALTER TABLE): every module looks again. */
static void
store_relcache_changed(Datum arg, Oid relid)
{
	relations_valid = false;
}

void
ds_store_init_module(void)
{
	CacheRegisterRelcacheCallback(store_relcache_changed, (Datum) 0);
}

/* Attribute numbers of columns names[0..n-1] of `relid`; each must exist. */
static void
lookup_attnums(Oid relid, const char *const *names, int n, AttrNumber *out)
{
	for (int i = 0; i < n; i++)
	{
		out[i] = get_attnum(relid, names[i]);
		if (out[i] == InvalidAttrNumber)
			elog(ERROR, "durable_steps.%s has no column \"%s\"", get_rel_name(relid), names[i]);
	}
}

/* The owner of table `relid`, after checking that it is a heap table. */
static Oid
heap_table_owner(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Form_pg_class form;
	Oid			owner;

	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	form = (Form_pg_class) GETSTRUCT(tuple);
	if (form->relkind != RELKIND_RELATION || form->relam != HEAP_TABLE_AM_OID)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("durable_steps.%s is not a heap table", NameStr(form->relname)),
				 errdetail("The extension reads and writes its tables' rows directly, as heap tuples."),
				 errhint("Recreate the extension with default_table_access_method = heap.")));
	owner = form->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

Oid
ds_store_extension(char **version)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			ext = InvalidOid;

	*version = NULL;
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("durable_steps"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion, RelationGetDescr(rel),
									 &isnull);

		ext = ((Form_pg_extension) GETSTRUCT(tuple))->oid;
		*version = isnull ? pstrdup("") : text_to_cstring(DatumGetTextPP(d));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return ext;
}

char *
ds_store_installed_version(void)
{
	char	   *version;

	(void) ds_store_extension(&version);
	return version;
}

/*
 * Is dotted version a older than b? Releases are numbered major.minor.patch; a part that is not
 * a number compares as 0, so that any version string compares without an error.
 */
static bool
version_older(const char *a, const char *b)
{
	while (*a != '\0' || *b != '\0')
	{
		char	   *end_a;
		char	   *end_b;
		long		na = strtol(a, &end_a, 10);
		long		nb = strtol(b, &end_b, 10);

		if (na != nb)
			return na < nb;
		a = end_a + strcspn(end_a, ".");
		b = end_b + strcspn(end_b, ".");
		a += *a == '.';
		b += *b == '.';
	}
	return false;
}

const char *
ds_store_version_hint(const char *installed)
{
	if (version_older(installed, DS_EXTENSION_VERSION))
		return "Run ALTER EXTENSION durable_steps UPDATE in this database (docs/operations.md, \"Upgrades\").";
	return psprintf("The installed extension is newer than the library: install the library of durable_steps %s and restart the server (docs/operations.md, \"Upgrades\").",
					installed);
}

/* DS426 when the extension installed here is not of this library's version. */
static void
check_installed_version(void)
{
	char	   *installed = ds_store_installed_version();

	if (installed != NULL && strcmp(installed, DS_EXTENSION_VERSION) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DS_VERSION_MISMATCH),
				 errmsg("extension \"durable_steps\" is installed at version %s in this database, and the server has loaded its library of version %s",
						installed, DS_EXTENSION_VERSION),
				 errdetail("Nothing is read or written in the extension's tables until the two versions match."),
				 errhint("%s", ds_store_version_hint(installed))));
}

/* Look the tables up; false when any is missing (the extension is not installed here). */
static bool
lookup_relations(void)
{
	const char *runs_policy = "policy";
	const char *runs_owner = "owner";
	Oid			nsp;

	if (step_column_names == NULL || attempt_column_names == NULL)
		elog(ERROR, "the layouts of durable_steps' tables were not registered");
	nsp = get_namespace_oid("durable_steps", true);
	relations.steps = OidIsValid(nsp) ? get_relname_relid("steps", nsp) : InvalidOid;
	relations.steps_pkey = OidIsValid(nsp) ? get_relname_relid("steps_pkey", nsp) : InvalidOid;
	relations.runs = OidIsValid(nsp) ? get_relname_relid("runs", nsp) : InvalidOid;
	relations.runs_pkey = OidIsValid(nsp) ? get_relname_relid("runs_pkey", nsp) : InvalidOid;
	relations.attempts = OidIsValid(nsp) ? get_relname_relid("attempts", nsp) : InvalidOid;
	if (!OidIsValid(relations.steps) || !OidIsValid(relations.steps_pkey) ||
		!OidIsValid(relations.attempts) ||
		!OidIsValid(relations.runs) || !OidIsValid(relations.runs_pkey))
		return false;
	check_installed_version();
	relations.owner = heap_table_owner(relations.steps);
	(void) heap_table_owner(relations.attempts);
	(void) heap_table_owner(relations.runs);
	lookup_attnums(relations.steps, step_column_names, n_step_columns, relations.step_attnums);
	lookup_attnums(relations.attempts, attempt_column_names, n_attempt_columns,
				   relations.attempt_attnums);
	lookup_attnums(relations.runs, &runs_policy, 1, &relations.runs_policy_attnum);
	lookup_attnums(relations.runs, &runs_owner, 1, &relations.runs_owner_attnum);

	/*
	 * the lookups may have processed invalidations; they concern other
	 * relations or none
	 */
	relations_valid = true;
	return true;
}

bool
ds_store_installed(void)
{
	return relations_valid || lookup_relations();
}

const StoreRelations *
ds_store_relations(void)
{
	if (!ds_store_installed())
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("extension \"durable_steps\" is not installed in this database"),
				 errhint("Run CREATE EXTENSION durable_steps.")));
	return &relations;
}
