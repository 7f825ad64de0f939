package cli

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// refuseZeros refuses an explicitly given zero (or empty string) for the
// named flags. The options behind them treat zero as "not set" and fill in
// the default, so `--node-ttl 0s` would silently run with 30s: an operator
// who typed 0 meant something else (off, unlimited, immediately), and
// getting the default instead is the kind of surprise that is found in an
// outage. Flags where 0 means something documented (such as
// --max-streams-per-identity 0, unlimited) are not listed. A value from the
// environment counts as given (applyEnv marks it changed).
func refuseZeros(fs *pflag.FlagSet, names ...string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic("refuseZeros: no flag --" + name) // a typo in the list, caught by any test of the command
		}
		if !f.Changed || !isZero(f) {
			continue
		}
		shown := f.Value.String()
		if shown == "" {
			shown = `""`
		}
		return fmt.Errorf("--%s %s: %s; to run with the default (%s), leave --%s out", name, shown, zeroReason(f), f.DefValue, name)
	}
	return nil
}

func isZero(f *pflag.Flag) bool {
	v := f.Value.String()
	switch f.Value.Type() {
	case "duration":
		d, err := time.ParseDuration(v)
		return err == nil && d == 0
	case "string":
		return v == ""
	default:
		return v == "0"
	}
}

func zeroReason(f *pflag.Flag) string {
	if f.Value.Type() == "string" {
		return "must not be empty"
	}
	return "must be positive (0 is not a setting here: it would silently mean the default)"
}
