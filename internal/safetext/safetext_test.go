package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCleanReplacesWhatATerminalActsOnOrHides(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "python3", "python3"},
		{"non-ASCII letters stay", "训练.py", "训练.py"},
		{"escape and bell", "\x1b]0;PWN\a", "\uFFFD]0;PWN\uFFFD"},
		{"C1", "a\u0085b", "a\uFFFDb"},
		{"bidi override", "a\u202Eb", "a\uFFFDb"},
		{"zero-width space", "py\u200Bthon", "py\uFFFDthon"},
		{"zero-width joiner", "py\u200Dthon", "py\uFFFDthon"},
		{"byte-order mark", "\uFEFFpython", "\uFFFDpython"},
		{"soft hyphen", "py\u00ADthon", "py\uFFFDthon"},
		{"word joiner", "py\u2060thon", "py\uFFFDthon"},
		{"invalid UTF-8", "py\xfftorch", "py\uFFFDtorch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Clean(tc.in); got != tc.want {
				t.Errorf("Clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestTwoNamesThatLookTheSameAreTheSame(t *testing.T) {
	// What a user sees must tell them apart: the one with a hidden character shows it.
	if Clean("train\u200B") == Clean("train") {
		t.Fatal("a name with a zero-width space cleans to the plain name: they would look alike and be different series")
	}
}

func TestCutBoundsBytesOnACharacterBoundary(t *testing.T) {
	long := strings.Repeat("é", 1000)
	got := Cut(long, 101)
	if len(got) > 101 || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Fatalf("Cut to 101 bytes gave %d bytes, valid %v: %q", len(got), utf8.ValidString(got), got)
	}
	if got := Cut("train.py:42 in forward", 200); got != "train.py:42 in forward" {
		t.Fatalf("a short string is cut: %q", got)
	}
	if got := Cut(strings.Repeat("\x1b", 10000), 64); len(got) > 64 {
		t.Fatalf("controls grow the result past the bound: %d bytes", len(got))
	}
}
