# pgxlanes: make test | bench | lint | demo | stress | test-containers
# Integration tests start their own PostgreSQL (internal/pgserver).
#
# The repository holds four modules, so that a program importing pgxlanes does not pull the
# test and demo dependencies into its module graph:
#   .                          the library: pgxlanes, metrics, stdlib, pgxlanestest, internal/...
#   pgxlanestest/containers    the Docker step of the test server search (testcontainers-go)
#   integration                tests against real PostgreSQL and PgBouncer, faults, conformance
#   examples                   the starvation demo (gonum/plot) and an HTTP service

GO         ?= go
BENCH      ?= .
BENCHCOUNT ?= 6
STRESS     ?= 2m
# Fuzzing budgets are counts of inputs, not durations: with a duration, Go before 1.27 can fail a
# target that found nothing with "context deadline exceeded" as the time runs out (a race in its
# fuzzing coordinator, golang/go#75804). 60,000 inputs take about 7-13 s per target on 2 cores.
FUZZTIME   ?= 60000x
STRESSFUZZ ?= 1000000x
DEMOFLAGS  ?=
MODULES    := . pgxlanestest/containers integration examples

SHELL := /bin/bash

.PHONY: all test bench lint vet fmt demo stress tidy fuzz

all: lint test

# Unit and integration tests of every module, always with the race detector. The integration
# module's packages run one at a time (-p 1): its latency checks compare pgxlanes with pgxpool on a
# 2-core machine, and the conformance stage runs several test processes of its own.
test: vet
	@set -e; for m in $(MODULES); do \
		p=""; if [ "$$m" = integration ]; then p="-p 1"; fi; \
		echo "== go test -race $$p ./... in $$m"; s=$$SECONDS; \
		(cd $$m && $(GO) test -race -count=1 $$p -timeout 30m ./...); \
		echo "== $$m: $$((SECONDS - s))s"; \
	done
	@$(MAKE) --no-print-directory fuzz

# The fuzz targets of internal/wire (the protocol under pgconn), $(FUZZTIME) inputs each; the seed
# corpus and testdata/fuzz run in every go test.
fuzz:
	@set -e; for f in FuzzInterrupt FuzzWriteFraming FuzzCutPrepare; do \
		echo "== go test -fuzz $$f -fuzztime $(FUZZTIME) ./internal/wire"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) ./internal/wire; \
	done

# Also for macOS, where developers run the tests too (the harness has no parent-death signal
# there: sysproc_other.go). Windows builds the library (pgxlanes, reserve, txguard, metrics,
# stdlib), not the test harness (internal/pgserver, Unix processes and signals) nor pgxlanestest.
vet:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./... && GOOS=darwin $(GO) vet ./...); done

# Benchmarks only, in benchstat's format: compare two runs with `benchstat old.txt bench.txt`.
# The exit status is go test's, not tee's.
bench:
	set -o pipefail; for m in . integration; do (cd $$m && $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCHCOUNT) ./...); done | tee bench.txt
	@echo "== pgxlanes against pgxpool (benchstat -col /Impl; the Impl=pgxpool column is the reference)"
	$(GO) run golang.org/x/perf/cmd/benchstat@latest -col /Impl bench.txt

# go vet, and gofmt must have nothing to say.
lint: vet
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi

fmt:
	gofmt -w .

tidy:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done

# examples is a module of its own: its commands run from examples/, so a relative -plot or -json
# path lands there (the demo prints the full path). `make demo DEMOFLAGS=-h` lists every flag.
demo:
	cd examples && $(GO) run ./starvation $(DEMOFLAGS)

# The example HTTP service on a throwaway PostgreSQL (HTTPFLAGS, e.g. -addr 127.0.0.1:8081).
HTTPFLAGS ?=
.PHONY: httpservice
httpservice:
	cd examples && $(GO) run ./httpservice $(HTTPFLAGS)

# The randomized stress tests for longer than in `make test`, the fault suite with each fault
# repeated under load for $(STRESS) (integration/fault_test.go; docs/reliability.md), and wire's
# fuzz targets for $(STRESSFUZZ) inputs each.
stress:
	PGXLANES_STRESS=$(STRESS) $(GO) test -race -count=1 -timeout 60m -run Stress ./reserve/...
	cd integration && PGXLANES_STRESS=$(STRESS) $(GO) test -race -count=1 -timeout 60m -run 'Stress|Fault' .
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(STRESSFUZZ)

# The harness's Docker path end to end (.ci/containers/run.sh): installs Debian's docker.io if
# dockerd is missing, starts a private dockerd that makes no traffic beyond 127.0.0.1, imports a
# PostgreSQL image from the local binaries, runs the tests that depend on the server's source (the
# Docker step's, the harness's server tests and pgxlanestest's) with the Docker step forced, then
# tears it all down. Needs root the first time (apt). Exit 3: the machine could not be provisioned
# (a banner says why).
.PHONY: test-containers
test-containers:
	bash .ci/containers/run.sh
