package metrics_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/metrics"
)

// The operations material in docs/ is tested here, next to the metrics it describes, so that a
// renamed metric breaks the build of its alerts, dashboard and documentation.

const docsDir = "../docs"

func readDoc(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(docsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exported returns the names of the metric families the collector exports, with their types.
func exported(t *testing.T) map[string]dto.MetricType {
	t.Helper()
	pool := newPool(t, offlineDSN)
	reg := registry(t, metrics.NewCollector(pool, metrics.WithTags("a")))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]dto.MetricType{}
	for _, mf := range mfs {
		names[mf.GetName()] = mf.GetType()
	}
	if len(names) < 20 {
		t.Fatalf("the collector exports %d metric families, want every family present from the start", len(names))
	}
	return names
}

var metricName = regexp.MustCompile(`\bpgxlanes_[a-z0-9_]+[a-z0-9]`)

// checkNames fails t for every pgxlanes_ name in text that the collector does not export (a
// histogram's _bucket, _count and _sum series count as exported).
func checkNames(t *testing.T, doc string, text []byte, names map[string]dto.MetricType) int {
	t.Helper()
	n := 0
	for _, m := range metricName.FindAll(text, -1) {
		name := string(m)
		n++
		if _, ok := names[name]; ok {
			continue
		}
		base, ok := cutAny(name, "_bucket", "_count", "_sum")
		if ok && names[base] == dto.MetricType_HISTOGRAM {
			continue
		}
		t.Errorf("%s uses %s, which the collector does not export", doc, name)
	}
	return n
}

func cutAny(s string, suffixes ...string) (string, bool) {
	for _, suf := range suffixes {
		if b, ok := strings.CutSuffix(s, suf); ok {
			return b, true
		}
	}
	return s, false
}

// rulesFile is the part of a Prometheus rules file the tests read.
type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func alertRules(t *testing.T) rulesFile {
	t.Helper()
	var rf rulesFile
	dec := yaml.NewDecoder(bytes.NewReader(readDoc(t, "alerts.yml")))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	return rf
}

// TestAlertRulesFile checks the rules file's structure and names without promtool: every rule is
// an alert with an expression, a severity, a summary, a description and a runbook link into
// operations.md, and uses only metrics the collector exports.
func TestAlertRulesFile(t *testing.T) {
	rf := alertRules(t)
	names := exported(t)
	ops := string(readDoc(t, "operations.md"))
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("group %s: a rule without alert name or expression: %+v", g.Name, r)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			anchor := "#" + strings.ToLower(r.Alert)
			if !strings.HasSuffix(r.Annotations["runbook_url"], "docs/operations.md"+anchor) {
				t.Errorf("%s: runbook_url %q does not point to operations.md%s", r.Alert, r.Annotations["runbook_url"], anchor)
			}
			if !strings.Contains(ops, "\n### "+r.Alert+"\n") {
				t.Errorf("%s: operations.md has no section \"### %s\" saying what to do", r.Alert, r.Alert)
			}
			checkNames(t, "alert "+r.Alert, []byte(r.Expr), names)
		}
	}
	for _, want := range []string{
		"PgxlanesShortLaneWaitHigh", "PgxlanesAcquireTimeoutRateHigh", "PgxlanesOldestWaiterOld",
		"PgxlanesWaitersPersistent", "PgxlanesBudgetViolations", "PgxlanesPoolUtilisationHigh",
		"PgxlanesBudgetTerminateFailures", "PgxlanesConnectionsStuckCleaning",
	} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml has no alert %s", want)
		}
	}
}

// TestAlertRulesPromtool validates docs/alerts.yml and runs its unit tests with promtool.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := pgserver.RequireTool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = docsDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Repeat  string `json:"repeat"`
	Targets []struct {
		Expr   string `json:"expr"`
		Format string `json:"format"`
	} `json:"targets"`
}

func TestDashboard(t *testing.T) {
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(readDoc(t, "dashboard.json")))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json is not valid JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard.json: uid %q, title %q, %d panels", d.UID, d.Title, len(d.Panels))
	}
	names := exported(t)
	ids := map[int]bool{}
	uses := map[string][]string{} // metric → titles of the panels that query it
	heatmaps := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: duplicate id %d", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			checkNames(t, "panel "+p.Title, []byte(tg.Expr), names)
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				uses[m] = append(uses[m], p.Title)
			}
			if p.Type == "heatmap" {
				if tg.Format != "heatmap" || p.Repeat != "lane" {
					t.Errorf("heatmap %q: format %q, repeat %q; want a heatmap of buckets repeated per lane", p.Title, tg.Format, p.Repeat)
				}
				heatmaps[metricName.FindString(tg.Expr)] = true
			}
		}
	}
	for _, h := range []string{"pgxlanes_acquire_wait_seconds_bucket", "pgxlanes_hold_seconds_bucket"} {
		if !heatmaps[h] {
			t.Errorf("no per-lane heatmap of %s", h)
		}
	}
	for _, m := range []string{
		"pgxlanes_lane_in_use_connections", "pgxlanes_lane_waiters", "pgxlanes_lane_oldest_wait_seconds",
		"pgxlanes_acquire_timeouts_total", "pgxlanes_acquire_rejections_total", "pgxlanes_budget_violations_total",
		"pgxlanes_lane_cleaning_connections", "pgxlanes_budget_terminate_failures_total", "pgxlanes_learning_demoted_statements",
	} {
		if len(uses[m]) == 0 {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestOperationsDocumentsEveryMetric fails when a metric is added without a line in
// operations.md, or operations.md names one that does not exist.
func TestOperationsDocumentsEveryMetric(t *testing.T) {
	ops := readDoc(t, "operations.md")
	names := exported(t)
	for name := range names {
		if !bytes.Contains(ops, []byte("| `"+name+"` |")) {
			t.Errorf("operations.md has no table row for %s", name)
		}
	}
	checkNames(t, "operations.md", ops, names)
}
