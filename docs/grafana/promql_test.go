package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// The metric names of a PromQL expression are found by a small tokenizer
// rather than Prometheus' own parser (github.com/prometheus/prometheus/
// promql/parser): that module would pull the whole Prometheus server and
// its dependencies into go.mod for one test. The tokenizer knows the parts
// of the language that can hold an identifier that is not a metric name —
// string literals, label matchers in {...}, ranges and subqueries in
// [...], the label lists of by/without/on/ignoring/group_left/group_right,
// function and aggregation names, keywords — and skips them; every other
// identifier is a metric name. Its own test (TestMetricNames) holds
// expressions of each shape, and the expressions checked here are
// promtool-checked too, so an expression it would misread is not valid
// PromQL to begin with.

// promqlKeywords are identifiers that are never metric names: aggregation
// operators (which may be followed by by/without before their parenthesis),
// set and comparison keywords, modifiers and literals.
var promqlKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "start": true, "end": true,
	"inf": true, "nan": true, "atan2": true,
}

// labelListKeywords are followed by a parenthesized list of label names.
var labelListKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// metricNames returns the metric names expr selects, in order of
// appearance, or an error for an expression it cannot tokenize (an
// unterminated string, brace or bracket).
func metricNames(expr string) ([]string, error) {
	var names []string
	skipTo := func(i int, close byte) (int, error) {
		for j := i; j < len(expr); j++ {
			switch expr[j] {
			case close:
				return j + 1, nil
			case '"', '\'', '`':
				end, err := skipString(expr, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			}
		}
		return 0, fmt.Errorf("%q: unterminated %q", expr, close)
	}
	nextNonSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n' || expr[i] == '\r') {
			i++
		}
		return i
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{':
			end, err := skipTo(i+1, '}')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '[':
			end, err := skipTo(i+1, ']')
			if err != nil {
				return nil, err
			}
			i = end
		case c == '$':
			// A Grafana variable ($job, ${job}, $__rate_interval)
			// outside a string or matcher: not a metric.
			i++
			if i < len(expr) && expr[i] == '{' {
				end, err := skipTo(i+1, '}')
				if err != nil {
					return nil, err
				}
				i = end
				continue
			}
			for i < len(expr) && isIdentChar(expr[i]) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			// A number or duration (1e3, 0x1f, 5m, 1h30m): it runs on
			// through letters and digits, none of it a name.
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			word := expr[i:j]
			next := nextNonSpace(j)
			switch {
			case labelListKeywords[strings.ToLower(word)]:
				if next < len(expr) && expr[next] == '(' {
					end, err := skipTo(next+1, ')')
					if err != nil {
						return nil, err
					}
					j = end
				}
			case promqlKeywords[strings.ToLower(word)]:
			case next < len(expr) && expr[next] == '(':
				// A function call.
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	return names, nil
}

// skipString returns the index after the string literal starting at i.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("%q: unterminated string at %d", s, i)
}

// query is one PromQL expression and where it came from.
type query struct{ where, expr string }

// dashboardQueries returns every PromQL expression of a Grafana dashboard:
// panel targets (rows' nested panels too) and query variables.
func dashboardQueries(path string) ([]query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				qs = append(qs, query{fmt.Sprintf("%s: panel %q target %s", path, p.Title, t.RefID), t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				return nil, fmt.Errorf("%s: variable %s: query is neither a string nor {query}", path, v.Name)
			}
			q.Query = s
		}
		// label_values(metric, label): the metric is the selector.
		expr := q.Query
		if inner, ok := strings.CutPrefix(expr, "label_values("); ok {
			sel, _, _ := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
			expr = sel
		}
		qs = append(qs, query{fmt.Sprintf("%s: variable %s", path, v.Name), expr})
	}
	return qs, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// ruleQueries returns the expr of every rule of a Prometheus rules file.
// It reads the YAML by lines (no YAML module in the build): "expr: <one
// line>" or a block scalar "expr: |" / "expr: >" followed by more-indented
// lines.
func ruleQueries(path string) ([]query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(raw), "\n")
	var qs []query
	for n := 0; n < len(lines); n++ {
		line := lines[n]
		trimmed := strings.TrimLeft(line, " ")
		rest, ok := strings.CutPrefix(strings.TrimPrefix(trimmed, "- "), "expr:")
		if !ok {
			continue
		}
		indent := len(line) - len(trimmed)
		rest = strings.TrimSpace(rest)
		expr := rest
		if strings.HasPrefix(rest, "|") || strings.HasPrefix(rest, ">") {
			var b []string
			for n+1 < len(lines) {
				next := lines[n+1]
				if t := strings.TrimLeft(next, " "); t != "" && len(next)-len(t) <= indent {
					break
				}
				b = append(b, strings.TrimSpace(next))
				n++
			}
			expr = strings.Join(b, " ")
		} else if len(expr) >= 2 && (expr[0] == '"' || expr[0] == '\'') && expr[len(expr)-1] == expr[0] {
			expr = expr[1 : len(expr)-1]
		}
		qs = append(qs, query{fmt.Sprintf("%s:%d", path, n+1), expr})
	}
	return qs, nil
}

// missingMetrics checks every query against the families a /metrics page
// declares (name -> type) and returns one line per metric a query names
// that the page does not export. A histogram's or summary's series
// (_bucket, _sum, _count) count as their family's.
func missingMetrics(qs []query, families map[string]string) ([]string, error) {
	var missing []string
	for _, q := range qs {
		names, err := metricNames(q.expr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", q.where, err)
		}
		if len(names) == 0 {
			missing = append(missing, fmt.Sprintf("%s: %q names no metric", q.where, q.expr))
		}
		for _, n := range names {
			if !exported(n, families) {
				missing = append(missing, fmt.Sprintf("%s: %s is not exported (in %q)", q.where, n, q.expr))
			}
		}
	}
	sort.Strings(missing)
	return missing, nil
}

func exported(name string, families map[string]string) bool {
	if _, ok := families[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch families[base] {
		case "histogram":
			return true
		case "summary":
			return suffix != "_bucket"
		}
	}
	return false
}

// families reads the "# TYPE name type" lines of a Prometheus text page.
func families(page string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(page, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			m[f[2]] = f[3]
		}
	}
	return m
}
