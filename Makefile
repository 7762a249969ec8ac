# pgxlanes: make test | bench | lint | demo | stress
# Integration tests start their own PostgreSQL (see integration/harness).

GO         ?= go
BENCH      ?= .
BENCHCOUNT ?= 6
STRESS     ?= 2m
DEMOFLAGS  ?=

.PHONY: all test bench lint vet fmt demo stress

all: lint test

# Unit and integration tests, always with the race detector.
test: vet
	$(GO) test -race -count=1 -timeout 30m ./...

vet:
	$(GO) vet ./...

# Benchmarks only, in benchstat's format: compare two runs with `benchstat old.txt bench.txt`.
# The exit status is go test's, not tee's.
bench:
	set -o pipefail; $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCHCOUNT) ./... | tee bench.txt
bench: SHELL := /bin/bash

# go vet, and gofmt must have nothing to say.
lint: vet
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi

fmt:
	gofmt -w .

demo:
	$(GO) run ./examples/starvation $(DEMOFLAGS)

# The reserve stress test for longer than in `make test`.
stress:
	PGXLANES_STRESS=$(STRESS) $(GO) test -race -count=1 -timeout 30m -run Stress ./reserve/...
