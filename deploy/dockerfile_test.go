package deploy_test

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
)

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct {
	line int
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// dockerStage is the instructions from one FROM to the next.
type dockerStage struct {
	from  string // image reference
	name  string // AS name, if any
	flags []string
	instr []dockerInstr
}

// parseDockerfile splits a Dockerfile into stages. It understands what this
// repository's Dockerfile uses (comments, parser directives, backslash
// continuations, FROM flags and AS); a heredoc is refused rather than
// misread.
func parseDockerfile(src string) ([]dockerStage, error) {
	var instrs []dockerInstr
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(src, "\n") {
		line := strings.TrimSpace(raw)
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(line, "#") {
			continue // comments inside a continued instruction are dropped
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		text := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(text, " ")
		if strings.Contains(args, "<<") {
			return nil, fmt.Errorf("line %d: heredocs are not supported by this lint", start)
		}
		instrs = append(instrs, dockerInstr{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: continuation at end of file", start)
	}
	var stages []dockerStage
	for _, in := range instrs {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			var st dockerStage
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				st.flags = append(st.flags, f[0])
				f = f[1:]
			}
			if len(f) == 0 {
				return nil, fmt.Errorf("line %d: FROM without an image", in.line)
			}
			st.from = f[0]
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("line %d: cannot read FROM %q", in.line, in.args)
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" {
				continue // global ARG before the first FROM
			}
			return nil, fmt.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
		}
		stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, in)
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no FROM")
	}
	return stages, nil
}

// staticBuild is what the lint extracts from the build stage's go build
// RUN: its environment assignments and go build's arguments.
type staticBuild struct {
	env  map[string]string
	args []string // after "go build"
	out  string   // -o
}

// splitShell splits a shell command line into words: single and double
// quotes, no expansion (the caller substitutes ARGs). Enough for a RUN
// line; anything fancier ($(...), pipes) is the lint's business to refuse.
func splitShell(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				w.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// findGoBuild finds the RUN that runs go build in stage st and reads it.
func findGoBuild(st dockerStage) (*staticBuild, int, error) {
	for _, in := range st.instr {
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		if strings.ContainsAny(in.args, "|;&`") || strings.Contains(in.args, "$(") {
			return nil, in.line, fmt.Errorf("line %d: the go build RUN must be one plain command (no pipes, lists or substitutions) so it can be checked", in.line)
		}
		words, err := splitShell(in.args)
		if err != nil {
			return nil, in.line, fmt.Errorf("line %d: %v", in.line, err)
		}
		b := &staticBuild{env: map[string]string{}}
		i := 0
		for ; i < len(words) && strings.HasPrefix(words[i], "--mount="); i++ {
		}
		for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
			k, v, _ := strings.Cut(words[i], "=")
			b.env[k] = v
		}
		if i+1 >= len(words) || words[i] != "go" || words[i+1] != "build" {
			return nil, in.line, fmt.Errorf("line %d: expected [VAR=value...] go build ..., got %q", in.line, in.args)
		}
		b.args = words[i+2:]
		for j, a := range b.args {
			if a == "-o" && j+1 < len(b.args) {
				b.out = b.args[j+1]
			} else if strings.HasPrefix(a, "-o=") {
				b.out = strings.TrimPrefix(a, "-o=")
			}
		}
		return b, in.line, nil
	}
	return nil, 0, fmt.Errorf("no RUN with go build in stage %q", st.name)
}

var (
	// A digest pin: image@sha256:<64 hex>.
	digestRef = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)
	// A tag that names a release, not a moving "latest".
	pinnedTag = regexp.MustCompile(`:[0-9][0-9A-Za-z.\-_]*$`)
)

// lintDockerfile returns every rule src breaks; none for a good one.
func lintDockerfile(src string) []string {
	stages, err := parseDockerfile(src)
	if err != nil {
		return []string{err.Error()}
	}
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if len(stages) < 2 {
		bad("want a multi-stage build (a build stage and a runtime stage), got %d stage(s)", len(stages))
	}
	byName := map[string]dockerStage{}
	for _, st := range stages {
		if st.name != "" {
			byName[st.name] = st
		}
		ref := st.from
		if !digestRef.MatchString(ref) && !pinnedTag.MatchString(ref) {
			bad("FROM %s: pin the base image by a version tag or a digest", ref)
		}
		for _, in := range st.instr {
			if in.cmd == "ADD" && regexp.MustCompile(`(?i)(https?://|git@|\.git\b)`).MatchString(in.args) {
				bad("line %d: ADD of a URL: fetch nothing unverified into the image (use COPY, or a checked download in the build stage)", in.line)
			}
		}
	}
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		bad("final stage FROM %s: want a distroless static base (gcr.io/distroless/static-*)", final.from)
	}
	if !digestRef.MatchString(final.from) {
		bad("final stage FROM %s: pin the runtime base by digest", final.from)
	}
	var user, entry string
	var copies []dockerInstr
	for _, in := range final.instr {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			copies = append(copies, in)
		case "RUN":
			bad("line %d: RUN in the final stage: the runtime base has no shell, and the image should hold nothing but the binary", in.line)
		}
	}
	u, _, _ := strings.Cut(user, ":")
	switch {
	case user == "":
		bad("final stage has no USER: the image would run as root")
	case u == "0" || u == "root":
		bad("final stage USER %s: must not be root", user)
	case !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(u):
		bad("final stage USER %s: use a numeric uid (65532, distroless' nonroot) so the kubelet can check runAsNonRoot", user)
	}
	// ENTRYPOINT in exec form: a shell form would need /bin/sh, which the
	// base does not have.
	ep := regexp.MustCompile(`^\[\s*"([^"]+)"`).FindStringSubmatch(entry)
	if ep == nil {
		bad("ENTRYPOINT %q: want the exec form [\"/path/to/aether\", ...]", entry)
	} else if path.Base(ep[1]) != "aether" {
		bad("ENTRYPOINT runs %s, want the aether binary", ep[1])
	}

	// The build: the go build RUN of the stage the final stage copies the
	// entrypoint from, static and trimmed, its -o the file copied.
	var fromStage, copied string
	for _, c := range copies {
		f := strings.Fields(c.args)
		var from string
		var rest []string
		for _, w := range f {
			if strings.HasPrefix(w, "--from=") {
				from = strings.TrimPrefix(w, "--from=")
			} else if !strings.HasPrefix(w, "--") {
				rest = append(rest, w)
			}
		}
		if len(rest) != 2 || ep == nil {
			continue
		}
		dst := rest[1]
		if strings.HasSuffix(dst, "/") {
			dst += path.Base(rest[0])
		}
		if dst == ep[1] {
			fromStage, copied = from, rest[0]
		}
	}
	if ep != nil && copied == "" {
		bad("no COPY --from=<build stage> puts a binary at the ENTRYPOINT's path %s", ep[1])
		return probs
	}
	if ep == nil {
		return probs
	}
	bst, ok := byName[fromStage]
	if !ok {
		bad("ENTRYPOINT's binary is copied from %q, which is no stage of this file", fromStage)
		return probs
	}
	b, _, err := findGoBuild(bst)
	if err != nil {
		bad("%v", err)
		return probs
	}
	if b.env["CGO_ENABLED"] != "0" {
		bad("go build without CGO_ENABLED=0: the binary would link libc, which the static base lacks")
	}
	has := func(flag string) bool {
		for _, a := range b.args {
			if a == flag || strings.HasPrefix(a, flag+"=") {
				return true
			}
		}
		return false
	}
	if !has("-trimpath") {
		bad("go build without -trimpath")
	}
	if b.out != copied {
		bad("go build -o %q, but the final stage copies %q", b.out, copied)
	}
	if last := b.args[len(b.args)-1]; last != "./cmd/aether" {
		bad("go build builds %q, want ./cmd/aether", last)
	}
	return probs
}

func readDockerfile(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatalf("read the repository's Dockerfile: %v", err)
	}
	return string(src)
}

func TestDockerfileLint(t *testing.T) {
	src := readDockerfile(t)
	if probs := lintDockerfile(src); len(probs) > 0 {
		t.Fatalf("Dockerfile breaks %d rule(s):\n  %s", len(probs), strings.Join(probs, "\n  "))
	}
	// The builder's Go is the module's: go.mod's go line is the toolchain
	// CI and developers build with, so the image is built with the same.
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	stages, _ := parseDockerfile(src)
	builder := regexp.MustCompile(`^golang:([0-9.]+)(-|$)`).FindStringSubmatch(stages[0].from)
	if goLine == nil || builder == nil || builder[1] != string(goLine[1]) {
		t.Errorf("the build stage is FROM %s, go.mod says go %s: build with the module's Go", stages[0].from, goLine[1])
	}
}

// The lint is only worth something if it refuses a bad Dockerfile: each
// case breaks the repository's Dockerfile in one way.
func TestDockerfileLintCatchesBreakage(t *testing.T) {
	good := readDockerfile(t)
	cases := []struct {
		name, old, new, want string
	}{
		{"root user", "USER 65532:65532", "USER root", "must not be root"},
		{"uid 0", "USER 65532:65532", "USER 0:0", "must not be root"},
		{"no user", "USER 65532:65532\n", "", "no USER"},
		{"named user", "USER 65532:65532", "USER nonroot", "numeric uid"},
		{"cgo on", "CGO_ENABLED=0 ", "", "CGO_ENABLED=0"},
		{"cgo 1", "CGO_ENABLED=0 ", "CGO_ENABLED=1 ", "CGO_ENABLED=0"},
		{"no trimpath", "-trimpath ", "", "-trimpath"},
		{"add url", "COPY go.mod go.sum ./", "ADD https://example.org/x.tar.gz /x", "ADD of a URL"},
		{"shell entrypoint", `ENTRYPOINT ["/usr/local/bin/aether"]`, "ENTRYPOINT /usr/local/bin/aether", "exec form"},
		{"entrypoint elsewhere", `ENTRYPOINT ["/usr/local/bin/aether"]`, `ENTRYPOINT ["/aether"]`, "ENTRYPOINT's path"},
		{"output elsewhere", "-o /out/aether", "-o /out/other", "final stage copies"},
		{"unpinned runtime", "static-debian12:nonroot@sha256:", "static-debian12:nonroot#", "pin"},
		{"latest builder", "golang:1.26.8-bookworm", "golang:latest", "pin the base image"},
		{"not distroless", "FROM gcr.io/distroless/static-debian12", "FROM docker.io/library/debian", "distroless"},
		{"single stage", "FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab\nCOPY --from=build /out/aether /usr/local/bin/aether\n", "", "multi-stage"},
		{"run in final", "USER 65532:65532", "RUN chmod 755 /usr/local/bin/aether\nUSER 65532:65532", "RUN in the final stage"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(good, c.old) {
				t.Fatalf("the Dockerfile no longer contains %q: update this case", c.old)
			}
			broken := strings.Replace(good, c.old, c.new, 1)
			probs := lintDockerfile(broken)
			for _, p := range probs {
				if strings.Contains(p, c.want) {
					return
				}
			}
			t.Fatalf("lint missed it: want a problem containing %q, got %q", c.want, probs)
		})
	}
}
