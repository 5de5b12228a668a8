/*
 * key.c -- ds_key(VARIADIC "any"): canonical business keys from typed parts (docs/steps.md, "Keys").
 *
 * Each supported value has exactly one rendering, independent of DateStyle, TimeZone,
 * extra_float_digits or the scale a numeric was typed with, so the same business fact always
 * yields the same key. Parts are joined with ':'; inside a part ':' and '\' are escaped with '\',
 * which makes the encoding injective: reading left to right, an unescaped ':' is always a
 * separator, so two different part lists can never produce the same key.
 */
#include "base/compat.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/date.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "base/key.h"

PG_FUNCTION_INFO_V1(ds_key);
PG_FUNCTION_INFO_V1(ds_step_key);

void
ds_append_escaped_key_part(StringInfo buf, const char *s, int len)
{
	for (int i = 0; i < len; i++)
	{
		if (s[i] == ':' || s[i] == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, s[i]);
	}
}

/*
 * Percent-encode what a header value cannot carry raw. Receivers trim, fold or reject spaces,
 * control bytes and non-ASCII bytes, so those are all encoded, and '%' too, which keeps the
 * encoding reversible and so injective.
 */
static void
append_header_safe(StringInfo buf, const char *s, int len)
{
	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c > 0x20 && c < 0x7f && c != '%')
			appendStringInfoChar(buf, (char) c);
		else
			appendStringInfo(buf, "%%%02X", c);
	}
}

void
ds_append_step_key(StringInfo buf, const char *run_id, const char *step_id)
{
	StringInfoData identity;

	initStringInfo(&identity);
	ds_append_escaped_key_part(&identity, run_id, strlen(run_id));
	appendStringInfoChar(&identity, ':');
	ds_append_escaped_key_part(&identity, step_id, strlen(step_id));
	append_header_safe(buf, identity.data, identity.len);
	pfree(identity.data);
}

/* durable_steps.ds_step_key(run_id, step_id): the key of ds_append_step_key, for the views. */
Datum
ds_step_key(PG_FUNCTION_ARGS)
{
	StringInfoData buf;

	initStringInfo(&buf);
	ds_append_step_key(&buf, text_to_cstring(PG_GETARG_TEXT_PP(0)),
					   text_to_cstring(PG_GETARG_TEXT_PP(1)));
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

/* Numerics compare equal regardless of scale (42 = 42.000), so the rendering drops the scale. */
static char *
canonical_numeric(Numeric num)
{
	char	   *s = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(num)));
	char	   *dot = strchr(s, '.');

	if (dot != NULL && strpbrk(s, "eE") == NULL)
	{
		char	   *end = s + strlen(s) - 1;

		while (end > dot && *end == '0')
			*end-- = '\0';
		if (end == dot)
			*end = '\0';
	}
	if (strcmp(s, "-0") == 0)
		return pstrdup("0");
	return s;
}

/* A date as ds_key renders it: ISO 8601, BC years marked, infinities by name. */
static char *
canonical_date(DateADT date)
{
	char		buf[MAXDATELEN + 1];

	if (DATE_NOT_FINITE(date))
		return pstrdup(DATE_IS_NOBEGIN(date) ? "-infinity" : "infinity");
	else
	{
		struct pg_tm tm;

		j2date(date + POSTGRES_EPOCH_JDATE, &tm.tm_year, &tm.tm_mon, &tm.tm_mday);
		EncodeDateOnly(&tm, USE_ISO_DATES, buf);
		return pstrdup(buf);
	}
}

/* ISO 8601 in UTC with a 'T' and a 'Z', whatever the session's TimeZone and DateStyle. */
static char *
canonical_timestamptz(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;
	StringInfoData buf;

	if (TIMESTAMP_NOT_FINITE(ts))
		return pstrdup(TIMESTAMP_IS_NOBEGIN(ts) ? "-infinity" : "infinity");
	if (timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	initStringInfo(&buf);
	appendStringInfo(&buf, "%04d-%02d-%02dT%02d:%02d:%02d",
					 tm.tm_year > 0 ? tm.tm_year : -(tm.tm_year - 1),
					 tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
	if (fsec != 0)
	{
		char		frac[16];
		int			len;

		snprintf(frac, sizeof(frac), ".%06d", (int) fsec);
		len = strlen(frac);
		while (frac[len - 1] == '0')
			frac[--len] = '\0';
		appendStringInfoString(&buf, frac);
	}
	appendStringInfoChar(&buf, 'Z');
	if (tm.tm_year <= 0)
		appendStringInfoString(&buf, " BC");
	return buf.data;
}

/* Append part number `position` of a key, escaped, in its canonical form. */
static void
append_part(StringInfo buf, Datum value, Oid type, int position)
{
	char	   *rendered;
	int			len;
	Oid			base = getBaseType(type);

	switch (base)
	{
		case TEXTOID:
		case VARCHAROID:
			{
				text	   *t = DatumGetTextPP(value);

				rendered = VARDATA_ANY(t);
				len = VARSIZE_ANY_EXHDR(t);
				break;
			}
		case BPCHAROID:
			{
				/*
				 * char(n) ignores trailing blanks in comparisons, so its key
				 * does too
				 */
				text	   *t = DatumGetTextPP(value);

				rendered = VARDATA_ANY(t);
				len = bpchartruelen(rendered, VARSIZE_ANY_EXHDR(t));
				break;
			}
		case UNKNOWNOID:
		case CSTRINGOID:
			rendered = DatumGetCString(value);
			len = strlen(rendered);
			break;
		case NAMEOID:
			rendered = NameStr(*DatumGetName(value));
			len = strlen(rendered);
			break;
		case INT2OID:
			rendered = psprintf("%d", (int) DatumGetInt16(value));
			len = strlen(rendered);
			break;
		case INT4OID:
			rendered = psprintf("%d", DatumGetInt32(value));
			len = strlen(rendered);
			break;
		case INT8OID:
			rendered = psprintf(INT64_FORMAT, DatumGetInt64(value));
			len = strlen(rendered);
			break;
		case NUMERICOID:
			rendered = canonical_numeric(DatumGetNumeric(value));
			len = strlen(rendered);
			break;
		case UUIDOID:
			rendered = DatumGetCString(DirectFunctionCall1(uuid_out, value));
			len = strlen(rendered);
			break;
		case DATEOID:
			rendered = canonical_date(DatumGetDateADT(value));
			len = strlen(rendered);
			break;
		case TIMESTAMPTZOID:
			rendered = canonical_timestamptz(DatumGetTimestampTz(value));
			len = strlen(rendered);
			break;
		case BOOLOID:
			rendered = DatumGetBool(value) ? "true" : "false";
			len = strlen(rendered);
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("ds_key part %d has unsupported type %s", position,
							format_type_be(type)),
					 errhint("Key parts may be text, integers, numeric, uuid, date, timestamptz or boolean; cast other values explicitly.")));
	}
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ds_key part %d is empty", position),
				 errdetail("An empty part would make a key that names no business fact.")));
	ds_append_escaped_key_part(buf, rendered, len);
}

Datum
ds_key(PG_FUNCTION_ARGS)
{
	Datum	   *args;
	bool	   *nulls;
	Oid		   *types;
	int			nargs;
	StringInfoData buf;

	nargs = extract_variadic_args(fcinfo, 0, true, &args, &types, &nulls);
	if (nargs <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ds_key needs at least one part")));

	initStringInfo(&buf);
	for (int i = 0; i < nargs; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("ds_key part %d is null", i + 1),
					 errdetail("A key built from a missing value would name no business fact.")));
		if (i > 0)
			appendStringInfoChar(&buf, ':');
		append_part(&buf, args[i], types[i], i + 1);
	}
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}
