/*
 * sql_text.h -- SQL text a call stores to run later (a step's body, an outcome hook), checked at
 * the call (sql_text.c).
 */
#ifndef DS_SQL_TEXT_H
#define DS_SQL_TEXT_H

#include "base/compat.h"

/*
 * Raise unless `sql` is exactly one SQL statement that parses (syntax only: the tables and
 * functions it names may be created later). A syntax error keeps its SQLSTATE (42601) and says
 * which argument (`name`) holds it, so that a typo is an error at the call, never a stored
 * failure.
 */
extern void ds_check_one_statement(const char *name, const char *sql);

#endif							/* DS_SQL_TEXT_H */
