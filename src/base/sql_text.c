/*
 * sql_text.c -- SQL text checked at the call (sql_text.h).
 *
 * PostgreSQL's own raw parser decides: what it accepts is what SPI_prepare will parse when the
 * text runs, and it looks at no catalog, so a body may name a table its run creates later.
 */
#include "base/compat.h"

#include "nodes/parsenodes.h"
#include "nodes/pg_list.h"
#include "parser/parser.h"

#include "base/sql_text.h"

void
ds_check_one_statement(const char *name, const char *sql)
{
	MemoryContext cxt = CurrentMemoryContext;
	List	   *parsed = NIL;

	if (strspn(sql, " \t\r\n\f\v;") == strlen(sql))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must contain a statement", name)));
	PG_TRY();
	{
		parsed = raw_parser(sql, RAW_PARSE_DEFAULT);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/*
		 * the parser's position would point into the caller's query, not into
		 * `sql`
		 */
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		ereport(ERROR,
				(errcode(edata->sqlerrcode),
				 errmsg("%s is not valid SQL: %s", name, edata->message),
				 errhint("Nothing was stored: correct the SQL and call again.")));
	}
	PG_END_TRY();
	if (list_length(parsed) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("%s must be exactly one SQL statement", name),
				 errdetail("It has %d.", list_length(parsed))));

	/*
	 * it runs inside the caller's transaction, through SPI, which refuses
	 * these
	 */
	if (IsA(linitial_node(RawStmt, parsed)->stmt, TransactionStmt))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
				 errmsg("%s must not be a transaction statement (BEGIN, COMMIT, ROLLBACK, SAVEPOINT ...)",
						name),
				 errdetail("It runs inside the caller's transaction, which commits or rolls it back.")));
}
