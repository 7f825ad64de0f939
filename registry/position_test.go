package registry

import (
	"strings"
	"testing"
)

func TestParsePosition(t *testing.T) {
	long := strings.Repeat("e", MaxEpochLen)
	for _, tc := range []struct {
		in      string
		want    Position
		wantErr string // substring of the error; "" means accepted
	}{
		{in: "", want: Position{}},
		{in: "abc:42", want: Position{Epoch: "abc", Seq: 42}},
		{in: "3f9a0c12b7d4:0", want: Position{Epoch: "3f9a0c12b7d4", Seq: 0}},
		{in: "e:18446744073709551615", want: Position{Epoch: "e", Seq: 1<<64 - 1}},
		{in: long + ":1", want: Position{Epoch: long, Seq: 1}},
		// Leading zeros are a decimal number still; the registrar has always
		// accepted them.
		{in: "e:007", want: Position{Epoch: "e", Seq: 7}},

		{in: "42", wantErr: "is not a version token"},
		{in: ":4", wantErr: "is not a version token"},
		{in: ":", wantErr: "is not a version token"},
		{in: long + "e:1", wantErr: "is not a version token"},
		{in: "abc:", wantErr: "has a bad sequence number"},
		{in: "abc:-1", wantErr: "has a bad sequence number"},
		{in: "abc:+1", wantErr: "has a bad sequence number"},
		{in: "abc:x", wantErr: "has a bad sequence number"},
		{in: "abc:0x10", wantErr: "has a bad sequence number"},
		{in: "abc: 1", wantErr: "has a bad sequence number"},
		{in: "abc:1:2", wantErr: "has a bad sequence number"},
		{in: "e:18446744073709551616", wantErr: "has a bad sequence number"},
	} {
		got, err := ParsePosition(tc.in)
		if tc.wantErr == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParsePosition(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParsePosition(%q) = %+v, accepted; want an error containing %q", tc.in, got, tc.wantErr)
			continue
		}
		// Every refusal says what was expected and how to get out of it.
		for _, part := range []string{tc.wantErr, "last_version", "<epoch>:<sequence>", "leave it empty"} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("ParsePosition(%q) error %q lacks %q", tc.in, err, part)
			}
		}
	}
}

func TestParsePositionQuotesAHostileTokenShortly(t *testing.T) {
	_, err := ParsePosition(strings.Repeat("\x00", 10000))
	if err == nil {
		t.Fatal("accepted")
	}
	if len(err.Error()) > 600 || strings.ContainsRune(err.Error(), 0) {
		t.Fatalf("error is %d bytes or holds a raw NUL: %.120q", len(err.Error()), err)
	}
}

func TestPositionString(t *testing.T) {
	for _, tc := range []struct {
		p    Position
		want string
	}{
		{Position{}, ""},
		{Position{Epoch: "abc", Seq: 42}, "abc:42"},
		{Position{Epoch: "abc"}, "abc:0"},
		// No epoch names no history: there is nothing to resume from.
		{Position{Seq: 9}, ""},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// FuzzParsePosition: the parser accepts exactly "<epoch>:<decimal uint64>"
// with an epoch of 1..MaxEpochLen bytes and no colon (or ""), and String
// gives back a token that parses to the same position.
func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"", "abc:42", "42", ":4", "abc:", "abc:-1", "e:007", "a:b:c", "e:18446744073709551616", strings.Repeat("x", 65) + ":1", "\x00:\x00", "é:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePosition(s)
		if err != nil {
			if p != (Position{}) {
				t.Fatalf("ParsePosition(%q) failed but returned %+v", s, p)
			}
			if len(err.Error()) > 600 {
				t.Fatalf("ParsePosition(%q): error of %d bytes", s, len(err.Error()))
			}
			return
		}
		if s == "" {
			if !p.IsZero() {
				t.Fatalf("empty token gave %+v", p)
			}
			return
		}
		if p.Epoch == "" || len(p.Epoch) > MaxEpochLen || strings.Contains(p.Epoch, ":") {
			t.Fatalf("ParsePosition(%q) accepted epoch %q", s, p.Epoch)
		}
		if !strings.HasPrefix(s, p.Epoch+":") {
			t.Fatalf("ParsePosition(%q) = %+v: epoch is not the token's prefix", s, p)
		}
		for _, c := range s[len(p.Epoch)+1:] {
			if c < '0' || c > '9' {
				t.Fatalf("ParsePosition(%q) accepted a sequence with %q", s, c)
			}
		}
		back, err := ParsePosition(p.String())
		if err != nil || back != p {
			t.Fatalf("ParsePosition(%q) = %+v, but its String %q parses to %+v, %v", s, p, p.String(), back, err)
		}
	})
}
