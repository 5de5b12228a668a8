/*
 * served_databases.c -- which databases the background worker serves (docs/worker.md).
 *
 * durable_steps.database is '*' by default: every database in which the extension is installed.
 * The launcher cannot read another database's catalogs, so it learns where the extension is by
 * starting one executor in each database that accepts connections; an executor that finds no
 * extension says so in shared memory and exits, and the database is left alone until a backend
 * there commits work for the worker (CREATE EXTENSION does), or the configuration is reloaded.
 * A list of names serves exactly those databases, each waited for while it does not exist.
 */
#include "base/compat.h"

#include "miscadmin.h"
#include "commands/dbcommands.h"
#include "utils/lsyscache.h"	/* get_database_name() from 19 */
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/varlena.h"

#include "ipc/served_databases.h"

char	   *ds_worker_databases = NULL;

/* Split a copy of `value` into names; false when it is not a list of names. */
static bool
split_database_list(const char *value, List **names)
{
	char	   *raw = pstrdup(value);

	*names = NIL;
	return SplitGUCList(raw, ',', names);
}

/* check hook of durable_steps.database: '*' alone, or a non-empty list of names. */
static bool
check_databases(char **newval, void **extra, GucSource source)
{
	List	   *names;
	ListCell   *lc;

	if (!split_database_list(*newval, &names) || names == NIL)
	{
		GUC_check_errdetail("durable_steps.database must be '*' or a comma-separated list of database names.");
		return false;
	}
	foreach(lc, names)
	{
		const char *name = lfirst(lc);

		if (strcmp(name, "*") == 0 && list_length(names) > 1)
		{
			GUC_check_errdetail("'*' (every database) cannot be combined with database names.");
			return false;
		}
		if (strlen(name) >= NAMEDATALEN)
		{
			GUC_check_errdetail("Database name \"%s\" is too long.", name);
			return false;
		}
	}
	return true;
}

void
ds_served_databases_init_module(void)
{
	DefineCustomStringVariable("durable_steps.database",
							   "Databases whose durable steps the background worker runs.",
							   "'*' serves every database in which the extension is installed; otherwise a comma-separated list of database names.",
							   &ds_worker_databases,
							   "*",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   check_databases, NULL, NULL);
}

bool
ds_serves_every_database(void)
{
	return ds_worker_databases == NULL || strcmp(ds_worker_databases, "*") == 0;
}

List *
ds_listed_databases(void)
{
	List	   *names;

	if (ds_serves_every_database() || !split_database_list(ds_worker_databases, &names))
		return NIL;
	return names;
}

/* Does the worker serve the current database? */
static bool
this_database_served(void)
{
	char	   *here = get_database_name(MyDatabaseId);
	List	   *names = ds_listed_databases();
	ListCell   *lc;

	if (ds_serves_every_database())
		return true;
	foreach(lc, names)
		if (here != NULL && strcmp((char *) lfirst(lc), here) == 0)
		return true;
	return false;
}

void
ds_warn_if_database_not_served(void)
{
	/*
	 * the verdict holds until the setting is assigned again (a reload
	 * allocates a new string)
	 */
	static const char *checked_value = NULL;
	static bool served = true;
	static bool warned = false;

	if (ds_worker_databases == NULL || warned)
		return;
	if (checked_value != ds_worker_databases)
	{
		served = this_database_served();
		checked_value = ds_worker_databases;
	}
	if (served)
		return;
	warned = true;
	ereport(WARNING,
			(errmsg("the durable_steps worker does not serve database \"%s\": its deferred and retried steps will not run",
					get_database_name(MyDatabaseId)),
			 errhint("Add the database to durable_steps.database (or set it to '*') and reload the configuration.")));
}
