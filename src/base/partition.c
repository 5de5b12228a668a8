/*
 * partition.c -- the logical partitions of runs this server owns (docs/partitions.md).
 *
 * Runs are spread over independent servers by their run_id: partition hashtext(run_id) &
 * (partition_count - 1), which is exactly what a PL/Proxy router computes for RUN ON
 * hashtext(run_id) over a cluster of partition_count partitions, so a router needs nothing of
 * this extension to send a call where its run lives. A server owns the partitions listed in
 * durable_steps.partitions; every call that names a run of another partition is refused before it
 * reads or writes anything (DS201), so a misrouted call can never start a second history of a run
 * on the wrong server, and the worker claims nothing of a partition it does not own. Both
 * settings are reloadable: an operator fences a partition with ALTER SYSTEM and
 * pg_reload_conf(), and every process, the worker's included, stops taking its work at its next
 * statement. An idempotency key (idempotency/idempotent_requests.c) belongs to a partition the
 * same way, by hashtext(key): a router sends it where its entry lives, and it moves with the
 * partition.
 */
#include "base/compat.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/varlena.h"

#include "base/ds_errcodes.h"
#include "base/partition.h"

PG_FUNCTION_INFO_V1(ds_partition_of);
PG_FUNCTION_INFO_V1(ds_partition_owned);

static int	partition_count = 0;
static char *partitions_text = NULL;

/* The partitions listed in durable_steps.partitions, one bit each. */
typedef struct OwnedPartitions
{
	uint8		bits[DS_MAX_PARTITIONS / 8];
	int			n;				/* how many are listed */
} OwnedPartitions;

static const OwnedPartitions *owned = NULL;

/* check hook of durable_steps.partition_count: 0, or a power of two up to 1024. */
static bool
check_partition_count(int *newval, void **extra, GucSource source)
{
	if (*newval != 0 && (*newval & (*newval - 1)) != 0)
	{
		GUC_check_errdetail("durable_steps.partition_count must be 0 (not partitioned) or a power of two (1, 2, 4 ... %d): a run's partition is hashtext(run_id) & (partition_count - 1), as PL/Proxy computes it.",
							DS_MAX_PARTITIONS);
		return false;
	}
	return true;
}

/* check hook of durable_steps.partitions: a comma-separated list of partition numbers, or empty. */
static bool
check_partitions(char **newval, void **extra, GucSource source)
{
	OwnedPartitions parsed;
	OwnedPartitions *result;
	char	   *raw = pstrdup(*newval != NULL ? *newval : "");
	List	   *items = NIL;
	ListCell   *lc;

	memset(&parsed, 0, sizeof(parsed));
	if (!SplitIdentifierString(raw, ',', &items))
	{
		GUC_check_errdetail("durable_steps.partitions must be a comma-separated list of partition numbers, such as '0,2'.");
		return false;
	}
	foreach(lc, items)
	{
		const char *item = lfirst(lc);
		char	   *end;
		long		p;

		errno = 0;
		p = strtol(item, &end, 10);
		if (item[0] == '\0' || *end != '\0' || errno != 0 || p < 0 || p >= DS_MAX_PARTITIONS)
		{
			GUC_check_errdetail("\"%s\" is not a partition number: durable_steps.partitions lists numbers from 0 to %d, separated by commas.",
								item, DS_MAX_PARTITIONS - 1);
			return false;
		}
		if (parsed.bits[p / 8] & (1 << (p % 8)))
		{
			GUC_check_errdetail("Partition %ld is listed twice.", p);
			return false;
		}
		parsed.bits[p / 8] |= 1 << (p % 8);
		parsed.n++;
	}
	result = (OwnedPartitions *) ds_guc_extra_malloc(sizeof(OwnedPartitions));
	if (result == NULL)
		return false;
	*result = parsed;
	*extra = result;
	return true;
}

static void
assign_partitions(const char *newval, void *extra)
{
	owned = (const OwnedPartitions *) extra;
}

void
ds_partition_init_module(void)
{
	DefineCustomIntVariable("durable_steps.partition_count",
							"How many logical partitions runs and idempotency keys are spread over; 0 when this server is not partitioned.",
							"A power of two. A run's partition is hashtext(run_id) & (partition_count - 1), an idempotency key's hashtext(key) & (partition_count - 1).",
							&partition_count,
							0, 0, DS_MAX_PARTITIONS,
							PGC_SIGHUP,
							0,
							check_partition_count, NULL, NULL);
	DefineCustomStringVariable("durable_steps.partitions",
							   "The partitions this server owns, e.g. '0,2'.",
							   "Calls naming a run or an idempotency key of any other partition are refused (DS201), and the worker takes no work of them.",
							   &partitions_text,
							   "",
							   PGC_SIGHUP,
							   0,
							   check_partitions, assign_partitions, NULL);
}

int
ds_partition_count(void)
{
	return partition_count;
}

int
ds_partition_of_run(const char *run_id, int count)
{
	/* hashtext() under a deterministic collation: hash_any of the bytes */
	uint32		h = DatumGetUInt32(hash_any((const unsigned char *) run_id, (int) strlen(run_id)));

	return (int) (h & (uint32) (count - 1));
}

/*
 * Partitions listed without a count: a count refused when the configuration file was read (at
 * startup a bad value leaves the default, 0) must not leave a server that meant to own a few
 * partitions owning them all.
 */
static bool
partitions_without_count(void)
{
	return partition_count == 0 && owned != NULL && owned->n > 0;
}

uint64
ds_partition_settings_key(void)
{
	uint64		key;

	if (partition_count == 0 && (owned == NULL || owned->n == 0))
		return 0;
	key = (uint64) partition_count << 32;
	if (owned != NULL)
		key ^= hash_bytes_extended((const unsigned char *) owned->bits, sizeof(owned->bits), 0) &
			UINT64CONST(0xFFFFFFFF);

	/*
	 * never 0 when partitioned: 0 is "not partitioned" (and a slot that said
	 * nothing)
	 */
	return key | UINT64CONST(1) << 63;
}

bool
ds_partition_owns_partition(int p)
{
	if (partitions_without_count())
		return false;
	if (partition_count == 0)
		return true;
	/* a listed partition beyond the count owns nothing: fail closed */
	return owned != NULL && p >= 0 && p < partition_count &&
		(owned->bits[p / 8] & (1 << (p % 8))) != 0;
}

bool
ds_partition_owns(const char *run_id)
{
	if (partitions_without_count())
		return false;
	if (partition_count == 0)
		return true;
	return ds_partition_owns_partition(ds_partition_of_run(run_id, partition_count));
}

/*
 * Raise DS201 unless this server owns `id`'s partition: `what` names the thing ("run" or
 * "idempotency key"), `column` the text a router hashes ("run_id" or "key").
 */
static void
check_owned(const char *what, const char *id, const char *column)
{
	int			p;

	if (partitions_without_count())
		ereport(ERROR,
				(errcode(ERRCODE_DS_WRONG_PARTITION),
				 errmsg("%s %s cannot be served: durable_steps.partitions is set but durable_steps.partition_count is 0",
						what, id),
				 errdetail("A server that lists the partitions it owns refuses every run and idempotency key until it knows how many there are."),
				 errhint("Set durable_steps.partition_count (a power of two) and reload.")));
	if (partition_count == 0)
		return;
	p = ds_partition_of_run(id, partition_count);
	if (!ds_partition_owns_partition(p))
		ereport(ERROR,
				(errcode(ERRCODE_DS_WRONG_PARTITION),
				 errmsg("%s %s belongs to partition %d, which this server does not own", what, id, p),
				 errdetail("This server owns partitions {%s} of %d (durable_steps.partitions).",
						   partitions_text != NULL ? partitions_text : "", partition_count),
				 errhint("Send calls for %s %s to the server that owns partition %d: hashtext(%s) & %d.",
						 what, id, p, column, partition_count - 1)));
}

void
ds_partition_check_run(const char *run_id)
{
	check_owned("run", run_id, "run_id");
}

void
ds_partition_check_idempotency_key(const char *key)
{
	check_owned("idempotency key", key, "key");
}

/* ds_partition_of(run_id) -> integer: the partition of a run; NULL when not partitioned. */
Datum
ds_partition_of(PG_FUNCTION_ARGS)
{
	char	   *run_id = text_to_cstring(PG_GETARG_TEXT_PP(0));

	if (partition_count == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(ds_partition_of_run(run_id, partition_count));
}

/* durable_steps.ds_partition_owned(run_id) -> boolean: the worker's claims' filter. */
Datum
ds_partition_owned(PG_FUNCTION_ARGS)
{
	if (partition_count == 0 && !partitions_without_count())
		PG_RETURN_BOOL(true);
	PG_RETURN_BOOL(ds_partition_owns(text_to_cstring(PG_GETARG_TEXT_PP(0))));
}
