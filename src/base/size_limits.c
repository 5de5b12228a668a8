/*
 * size_limits.c -- bounds on what a role may store in the extension's tables.
 *
 * Every role may create steps, runs and events, and every byte of them is kept -- in the shared
 * tables, in their WAL, in every backup -- until retention removes the finished ones. Without a
 * bound one role fills the disk for all. The bounds are superuser settings (a role cannot raise
 * its own), checked at the call, before anything is stored, with an error that names the
 * setting. Results are bounded where they are made (durable_steps.max_result_size, step_exec.c)
 * and HTTP responses by durable_steps.http_max_response_size.
 */
#include "base/compat.h"

#include "utils/guc.h"

#include "base/size_limits.h"

static int	max_sql_size = 256 * 1024;
static int	max_input_size = 1024 * 1024;
static int	max_request_size = 1024 * 1024;
static int	max_event_payload_size = 64 * 1024;

typedef struct SizeSetting
{
	const char *name;
	const char *what;
	int		   *value;
} SizeSetting;

static const SizeSetting settings[] = {
	[DS_LIMIT_SQL] = {"durable_steps.max_sql_size", "SQL", &max_sql_size},
	[DS_LIMIT_INPUT] = {"durable_steps.max_input_size", "input", &max_input_size},
	[DS_LIMIT_REQUEST] = {"durable_steps.max_request_size", "HTTP request", &max_request_size},
	[DS_LIMIT_EVENT_PAYLOAD] = {"durable_steps.max_event_payload_size", "event payload",
	&max_event_payload_size},
};

static void
define_size_setting(DsSizeLimit which, const char *description, int boot_value)
{
	DefineCustomIntVariable(settings[which].name,
							description,
							"A larger value is refused where it is given, with SQLSTATE 54000.",
							settings[which].value,
							boot_value,
							1024,
							256 * 1024 * 1024,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);
}

void
ds_size_limits_init_module(void)
{
	define_size_setting(DS_LIMIT_SQL, "Largest SQL of a step's body or outcome hook, in bytes.",
						256 * 1024);
	define_size_setting(DS_LIMIT_INPUT, "Largest input of a step or a run, in bytes of jsonb.",
						1024 * 1024);
	define_size_setting(DS_LIMIT_REQUEST, "Largest request of an HTTP step, in bytes of jsonb.",
						1024 * 1024);
	define_size_setting(DS_LIMIT_EVENT_PAYLOAD, "Largest payload of an event, in bytes of jsonb.",
						64 * 1024);
}

void
ds_check_size(DsSizeLimit which, const char *argument, Size bytes)
{
	const SizeSetting *s = &settings[which];

	if (bytes > (Size) *s->value)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large", argument),
				 errdetail("The %s has %zu bytes; %s is %d bytes.", s->what, bytes, s->name,
						   *s->value),
				 errhint("Keep large data in a table of your own and pass its key; a superuser can raise %s.",
						 s->name)));
}
