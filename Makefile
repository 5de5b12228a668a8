# durable_steps -- PGXS build
EXTENSION = durable_steps
MODULE_big = durable_steps
# OBJS: every module of src/LAYERS that has a .c file, in the order of its layers. That file and
# each folder's README.md are the only lists of the modules: a line `name/` starts a folder (`/`
# is src/ itself), every other line names modules of that folder, and `#` starts a comment to the
# end of its line (as scripts/check-includes reads it). A module with only a .h (base/compat)
# builds no object.
ds_top := $(dir $(lastword $(MAKEFILE_LIST)))
ds_layers := $(ds_top)src/LAYERS
ifeq ($(wildcard $(ds_layers)),)
$(error $(ds_layers) is missing: it lists the modules to build)
endif
define ds_newline


endef
ds_hash := \#
ds_eol := :ds-end-of-line:
# one word per name, `#` and the end of each line being words of their own
ds_layers_words := $(subst $(ds_hash), $(ds_hash) ,$(subst $(ds_newline), $(ds_eol) ,$(file <$(ds_layers))))
ds_comment :=
ds_folder :=
ds_modules :=
ds_layers_word = $(if $(filter $(ds_eol),$1),$(eval ds_comment :=),$(if $(filter $(ds_hash),$1),$(eval ds_comment := 1),$(if $(ds_comment),,$(if $(filter %/,$1),$(eval ds_folder := $(patsubst /,,$1)),$(eval ds_modules += $(ds_folder)$1)))))
$(foreach w,$(ds_layers_words),$(call ds_layers_word,$w))
$(foreach m,$(ds_modules),$(if $(wildcard $(ds_top)src/$m.c $(ds_top)src/$m.h),,$(error src/LAYERS names $m, but there is no src/$m.c or src/$m.h)))
OBJS := $(foreach m,$(ds_modules),$(if $(wildcard $(ds_top)src/$m.c),src/$m.o))

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
# The library knows its own version, the control file's default_version, and refuses to work on
# an extension installed at another one until ALTER EXTENSION ... UPDATE (docs/operations.md).
DS_EXTENSION_VERSION := $(shell sed -n "s/^default_version *= *'\([^']*\)'.*/\1/p" durable_steps.control)
ifeq ($(DS_EXTENSION_VERSION),)
$(error durable_steps.control names no default_version)
endif
PG_CPPFLAGS += -DDS_EXTENSION_VERSION='"$(DS_EXTENSION_VERSION)"'

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
$(OBJS): $(wildcard src/*.h src/*/*.h) durable_steps.control

# `make dist`: the PGXN distribution, durable_steps-<version>.zip (META.json at its top), of the
# files git tracks at HEAD -- nothing built, nothing untracked -- less what .gitattributes marks
# export-ignore (the client libraries, the benchmarks, the examples: packages of their own or the
# project's tooling). DIST_DIR is where it goes (the current directory by default).
DIST_DIR ?= .
DS_DIST := durable_steps-$(DS_EXTENSION_VERSION)
.PHONY: dist
dist:
	git -C $(ds_top) archive --format zip --prefix=$(DS_DIST)/ -o $(abspath $(DIST_DIR))/$(DS_DIST).zip HEAD
	@echo "$(abspath $(DIST_DIR))/$(DS_DIST).zip"
