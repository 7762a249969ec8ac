package statuspage

import "html/template"

// pageTemplate is the HTML page: inline styles, no script, html/template's escaping for every
// value (tags and SQL text come from the application).
var pageTemplate = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{{if .RefreshS}}<meta http-equiv="refresh" content="{{.RefreshS}}">{{end}}
<title>{{.Name}}: pgxlanes status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em 2em; color: #222; background: #fff; }
h1 { font-size: 1.35em; margin: 0 0 .2em; }
h2 { font-size: 1.1em; margin: 1.4em 0 .4em; border-bottom: 1px solid #ddd; padding-bottom: .15em; }
.sub { color: #666; margin: 0 0 .8em; }
table { border-collapse: collapse; }
th, td { padding: .22em .7em; text-align: left; border-bottom: 1px solid #eee; vertical-align: top; }
th { font-weight: 600; color: #444; background: #f6f6f6; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, monospace; overflow-wrap: anywhere; }
td.who { white-space: nowrap; }
td.site { max-width: 34em; }
.bar { position: relative; width: 180px; height: 14px; background: #eef1f4; border-radius: 3px; overflow: hidden; }
.bar .own { position: absolute; top: 0; bottom: 0; left: 0; background: #4a7fc1; }
.bar .bor { position: absolute; top: 0; bottom: 0; background: #9bbbe3; }
.bar .res { position: absolute; top: -2px; bottom: -2px; width: 2px; background: #222; }
.warn { background: #fff3cd; }
.bad { background: #f8d7da; }
.muted { color: #888; }
.none { color: #888; font-style: italic; }
</style>
</head>
<body>
<h1>{{.Name}}: pgxlanes status</h1>
<p class="sub">taken {{.Taken}}{{if .RefreshS}}, reloads every {{.RefreshS}} s{{end}} · <a href="?format=json">JSON</a></p>

<h2>Lanes</h2>
<table id="lanes">
<tr><th>lane</th><th>in use of cap (| reserve)</th><th class="n">in use</th><th class="n">borrowed</th><th class="n">cleaning</th><th class="n">reserve</th><th class="n">cap</th><th class="n">waiting</th><th class="n">oldest wait</th><th class="n">acquire timeout</th><th class="n">timeouts</th><th class="n">rejected</th></tr>
{{range .Lanes}}<tr class="lane" data-lane="{{.Lane}}">
<td><b>{{.Lane}}</b></td>
<td><div class="bar" title="{{.InUse}} of {{.MaxConns}}, reserve {{.Reserved}}"><div class="own" style="width: {{printf "%.1f" .OwnPct}}%"></div><div class="bor" style="left: {{printf "%.1f" .OwnPct}}%; width: {{printf "%.1f" .BorrowedPct}}%"></div><div class="res" style="left: {{printf "%.1f" .ReservePct}}%"></div></div></td>
<td class="n in-use">{{.InUse}}</td><td class="n">{{.Borrowed}}</td><td class="n">{{.Cleaning}}</td><td class="n">{{.Reserved}}</td><td class="n">{{.MaxConns}}</td>
<td class="n waiting">{{.Waiting}}{{if .MaxWaiters}} <span class="muted">/ {{.MaxWaiters}}</span>{{end}}</td>
<td class="n {{.WaitLevel}}">{{.OldestWait}}</td><td class="n">{{.Timeout}}</td><td class="n">{{.Timeouts}}</td><td class="n">{{.Rejections}}</td>
</tr>
{{end}}</table>

<h2>Leases held longest</h2>
<p class="sub">{{.HeldLeases}} Tx and Long leases held now{{if gt .HeldLeases (len .Leases)}}; the {{len .Leases}} oldest{{end}}. Short's are bounded by its statement timeout and not listed.</p>
{{if .Leases}}<table id="leases">
<tr><th>lane</th><th>tag</th><th>kind</th><th class="n">age</th><th class="n">budget</th><th class="n">of budget</th><th>over budget</th><th class="n">backend PID</th><th>call site</th></tr>
{{range .Leases}}<tr class="lease {{.Level}}">
<td>{{.Lane}}</td><td>{{.Tag}}</td><td>{{.Kind}}</td><td class="n">{{.Age}}</td><td class="n">{{.Budget}}</td><td class="n">{{if .BudgetMS}}{{.Pct}} %{{else}}–{{end}}</td>
<td class="who">{{.OverAt}}{{if .Violation}} · <b>{{.Violation}} done</b>{{else if .Flagged}} · <b>flagged</b>{{end}}</td>
<td class="n">{{.PID}}</td><td class="site">{{if .CallSite}}<code>{{.CallSite}}</code>{{else}}<span class="muted">not captured</span>{{end}}</td>
</tr>
{{end}}</table>{{else}}<p class="none">none</p>{{end}}

<h2>Who blocks whom</h2>
{{if not .LockLookup}}<p class="none">lock lookup off</p>
{{else}}{{if .LockWaitsError}}<p class="bad">{{.LockWaitsError}}</p>{{end}}
{{if .LockWaits}}<table id="locks">
<tr><th class="n">waiting PID</th><th class="n">waited</th><th>waiter</th><th class="n">holder PID</th><th>holder state</th><th class="n">holder's transaction</th><th>holder</th></tr>
{{range .LockWaits}}<tr class="lockwait">
<td class="n">{{.Waiter}}</td><td class="n">{{.Waited}}</td>
<td class="who">{{with .WaiterLease}}{{.Lane}} · {{.Tag}} · {{.Kind}}{{else}}<span class="muted">not a Tx or Long lease of this pool</span>{{end}}</td>
<td class="n">{{.Holder}}</td><td>{{.HolderState}}</td><td class="n">{{.HolderXactAge}}</td>
<td class="site">{{with .HolderLease}}{{.Lane}} · {{.Tag}} · {{.Kind}}, held {{.Age}}{{if .CallSite}} · <code>{{.CallSite}}</code>{{end}}{{else}}<span class="muted">not a Tx or Long lease of this pool</span>{{end}}</td>
</tr>
{{end}}</table>{{else if not .LockWaitsError}}<p class="none">nobody waits for a lock</p>{{end}}
{{end}}

<h2>Statements the learner moved</h2>
{{with .Learning}}<p class="sub">{{if .On}}threshold {{.Threshold}}; {{.Demoted}} in Long's capacity now; {{.Demotions}} demoted and {{.Promotions}} promoted since start; {{.Tracked}} tracked{{else}}learning is off{{end}}</p>{{end}}
{{if .Statements}}<table id="statements">
<tr><th>when</th><th>change</th><th>statement</th></tr>
{{range .Statements}}<tr class="statement"><td>{{.Ago}}</td><td>{{if .Demoted}}<b>to Long</b>{{else}}back to Short{{end}}</td><td><code>{{.SQL}}</code></td></tr>
{{end}}</table>{{else}}<p class="none">no change yet</p>{{end}}

<h2>Recent budget actions</h2>
<p class="sub">{{.ActionsTotal}} since the pool started{{if .MoreActions}}; the {{len .Actions}} latest{{end}}</p>
{{if .Actions}}<table id="actions">
<tr><th>when</th><th>action</th><th>lane</th><th>tag</th><th class="n">elapsed</th><th class="n">budget</th><th class="n">backend PID</th><th>call site</th><th>error</th></tr>
{{range .Actions}}<tr class="action {{if .Err}}bad{{else if eq .Action "warning"}}{{else}}warn{{end}}"><td>{{.Ago}}</td><td><b>{{.Action}}</b></td><td>{{.Lane}}</td><td>{{.Tag}}</td><td class="n">{{.Elapsed}}</td><td class="n">{{.Budget}}</td><td class="n">{{.PID}}</td><td class="site">{{if .CallSite}}<code>{{.CallSite}}</code>{{end}}</td><td>{{.Err}}</td></tr>
{{end}}</table>{{else}}<p class="none">none yet</p>{{end}}
</body>
</html>
`))
