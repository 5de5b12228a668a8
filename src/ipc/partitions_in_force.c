/*
 * partitions_in_force.c -- the partitions this server owns as its latest reload says, kept in
 * shared memory (docs/partitions.md, "Moving a partition").
 *
 * A backend reads the configuration file between client statements only: a procedure that
 * commits in a loop, or any statement that runs for long, keeps the partitions of the settings
 * it began with, and would go on writing a partition fenced meanwhile -- after its export, onto
 * no server. So each process that loaded the file publishes the partitions it read here,
 * stamped with when it loaded them (a later load wins: a process slow to publish never brings
 * back an older list), and every check of a run's or an idempotency key's partition
 * (base/partition.c) asks this record too: a partition the latest reload fenced is refused at
 * once, in every process, whatever settings it began with. The record only ever refuses: a
 * process owns a partition when its own settings and the latest reload both say so.
 */
#include "base/compat.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/timestamp.h"

#include "base/partition.h"
#include "ipc/partitions_in_force.h"

typedef struct PartitionsInForce
{
	slock_t		mutex;
	TimestampTz loaded_at;		/* when the publishing process loaded the file */
	int			count;			/* durable_steps.partition_count then */
	uint8		bits[DS_MAX_PARTITIONS / 8];	/* durable_steps.partitions
												 * then */
} PartitionsInForce;

static PartitionsInForce *in_force = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* the load this process last published (or found superseded) */
static TimestampTz published_load = 0;

void
ds_partitions_in_force_publish(void)
{
	uint8		bits[DS_MAX_PARTITIONS / 8];
	int			count;

	if (in_force == NULL || published_load == PgReloadTime)
		return;
	count = ds_partition_owned_bits(bits);
	SpinLockAcquire(&in_force->mutex);
	if (PgReloadTime > in_force->loaded_at)
	{
		in_force->loaded_at = PgReloadTime;
		in_force->count = count;
		memcpy(in_force->bits, bits, sizeof(bits));
	}
	SpinLockRelease(&in_force->mutex);
	published_load = PgReloadTime;
}

PG_FUNCTION_INFO_V1(ds_partitions_in_force_publish_now);

/*
 * durable_steps.ds_partitions_in_force_publish() -> timestamptz: this process's partitions in
 * force (ds_partition_export, before it looks for transactions that may still write the
 * partition it exports); the time after it, from which every transaction that begins is refused
 * what this reload fenced.
 */
Datum
ds_partitions_in_force_publish_now(PG_FUNCTION_ARGS)
{
	ds_partitions_in_force_publish();
	PG_RETURN_TIMESTAMPTZ(GetCurrentTimestamp());
}

/*
 * (base/partition.h, PartitionInForceCheck) Does the latest reload own partition p of count?
 * A count of its own that differs owns nothing: the two settings were read apart.
 */
static bool
owned_in_force(int p, int count)
{
	bool		owned;

	if (in_force == NULL)
		return true;

	/*
	 * The worker's own processes take a reload only between claims, and an
	 * export waits until every one has (ds_partition_workers_behind) and for
	 * the attempts and turns they claimed before (docs/partitions.md): what
	 * they run was claimed under the settings it finishes with. A turn
	 * claimed before the fence must finish, not fail its run with DS201.
	 */
	if (MyBgworkerEntry != NULL && strcmp(MyBgworkerEntry->bgw_library_name, "durable_steps") == 0)
		return true;
	ds_partitions_in_force_publish();
	SpinLockAcquire(&in_force->mutex);
	if (in_force->count == 0)
		owned = true;			/* the latest reload does not partition */
	else
		owned = in_force->count == count && p >= 0 && p < count &&
			(in_force->bits[p / 8] & (1 << (p % 8))) != 0;
	SpinLockRelease(&in_force->mutex);
	return owned;
}

static void
in_force_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(PartitionsInForce)));
}

/* In the postmaster (and after a crash): its own settings, as loaded at its start or reload. */
static void
in_force_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	in_force = ShmemInitStruct("durable_steps partitions in force", sizeof(PartitionsInForce),
							   &found);
	if (!found)
	{
		SpinLockInit(&in_force->mutex);
		in_force->loaded_at = PgReloadTime;
		in_force->count = ds_partition_owned_bits(in_force->bits);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
ds_partitions_in_force_init_module(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = in_force_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = in_force_shmem_startup;
	ds_partition_set_in_force_check(owned_in_force);
}
