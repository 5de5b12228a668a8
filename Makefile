# durable_steps -- PGXS build
EXTENSION = durable_steps
MODULE_big = durable_steps
OBJS = \
	src/durable_steps.o \
	src/claim_size.o \
	src/classify.o \
	src/direct_write.o \
	src/http_claims.o \
	src/http_request.o \
	src/http_response.o \
	src/http_step.o \
	src/http_worker.o \
	src/key.o \
	src/launcher.o \
	src/policy.o \
	src/queues.o \
	src/replay_cache.o \
	src/retention.o \
	src/role_guard.o \
	src/run_context.o \
	src/run_http.o \
	src/run_step.o \
	src/run_steps.o \
	src/run_turn.o \
	src/runs.o \
	src/served_databases.o \
	src/size_limits.o \
	src/step_attempt.o \
	src/step_claims.o \
	src/step_context.o \
	src/step_exec.o \
	src/step_hooks.o \
	src/step_isolation.o \
	src/step_lock.o \
	src/step_probe.o \
	src/step_store.o \
	src/store_relations.o \
	src/worker.o \
	src/worker_wakeup.o

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
$(OBJS): $(wildcard src/*.h)
