# durable_steps -- PGXS build
EXTENSION = durable_steps
MODULE_big = durable_steps
OBJS = \
	src/durable_steps.o \
	src/base/key.o \
	src/base/policy.o \
	src/base/classify.o \
	src/base/size_limits.o \
	src/base/step_kind.o \
	src/base/sql_text.o \
	src/base/subtransaction.o \
	src/base/cron_schedule.o \
	src/base/partition.o \
	src/ipc/served_databases.o \
	src/ipc/worker_wakeup.o \
	src/ipc/claim_size.o \
	src/ipc/executor_load.o \
	src/ipc/fence_applied.o \
	src/ipc/unstarted_claims.o \
	src/ipc/outcome_waits.o \
	src/ipc/step_counters.o \
	src/http/http_addresses.o \
	src/http/http_request.o \
	src/http/http_response.o \
	src/http/http_transfer.o \
	src/store/citus_commit.o \
	src/store/store_relations.o \
	src/store/kept_plan.o \
	src/store/direct_write.o \
	src/store/step_lock.o \
	src/store/step_store.o \
	src/store/step_counters_json.o \
	src/store/partition_holds.o \
	src/store/step_probe.o \
	src/store/outcome_json.o \
	src/store/replay_cache.o \
	src/store/retention.o \
	src/store/role_guard.o \
	src/store/run_store.o \
	src/store/step_claim_store.o \
	src/store/run_claim_store.o \
	src/store/run_control_store.o \
	src/store/event_store.o \
	src/store/queue_store.o \
	src/store/schedule_store.o \
	src/store/idempotency_store.o \
	src/requests/idempotent.o \
	src/steps/step_isolation.o \
	src/steps/step_context.o \
	src/steps/deadline_timer.o \
	src/steps/caller_guard.o \
	src/steps/step_exec.o \
	src/steps/step_hooks.o \
	src/steps/step_attempt.o \
	src/steps/run_context.o \
	src/steps/step_call.o \
	src/steps/queues.o \
	src/steps/run_step.o \
	src/steps/http_step.o \
	src/runs/workflow_calls.o \
	src/runs/run_http.o \
	src/runs/run_claims.o \
	src/runs/run_turn.o \
	src/runs/runs.o \
	src/runs/waits.o \
	src/schedules/schedules.o \
	src/worker/worker_session.o \
	src/worker/http_outcomes.o \
	src/worker/step_claims.o \
	src/worker/http_claims.o \
	src/worker/worker.o \
	src/worker/http_worker.o \
	src/worker/launcher.o

DATA = $(wildcard sql/durable_steps--*.sql)
PGFILEDESC = "durable_steps - durable, retried, idempotent steps inside PostgreSQL"

# libcurl is linked from the start: HTTP steps live in this same library.
SHLIB_LINK = -lcurl
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
	-Wno-sign-compare -Wno-cast-function-type
# The project's own builds (scripts/test, CI) turn every warning into an error with
# `make WERROR=1`; a user's plain `make` does not, so that a newer compiler's new warning never
# stops an install.
ifdef WERROR
PG_CFLAGS += -Werror
endif
PG_CPPFLAGS = -I$(srcdir)/src $(DS_EXTRA_CPPFLAGS)

# Regression tests sit beside the install script, as sql/NN_name.sql with expected/NN_name.out:
# pg_regress reads <inputdir>/sql and <inputdir>/expected.
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/[0-9]*.sql)))
# pg_regress starts its own private instance with the library preloaded (test/regress.conf),
# so `make installcheck` needs no running server; it must run as a non-root user (initdb).
REGRESS_OPTS = --inputdir=. --outputdir=test --load-extension=durable_steps \
	--temp-instance=test/tmp_instance --temp-config=test/regress.conf \
	--encoding=UTF8 --no-locale
TAP_TESTS = 1
PROVE_TESTS ?= test/t/*.pl

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies: rebuild every object when any of our headers changes, so
# that no object keeps an old layout of a shared struct. (After the include, so that PGXS's
# `all` stays the default goal.)
$(OBJS): $(wildcard src/*.h src/*/*.h)
