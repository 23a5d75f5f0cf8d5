// Package safetext makes text that a process chose (its command name, the
// source lines its client reports) safe to show wherever the exporter shows
// it: labels, the landing page, logs, OOM reports, Kubernetes Events and a
// terminal reading any of them.
package safetext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Replacement stands in for every character Clean removes.
const Replacement = '\uFFFD'

// Clean replaces with U+FFFD what a terminal or a text renderer would act
// on or hide rather than show: bytes that are not UTF-8, C0 controls
// (escape, bell, newline, ...) and DEL, C1 controls, and every Unicode
// format character (category Cf: the bidirectional controls that reorder
// the text around them, zero-width spaces and joiners, the byte-order mark,
// the soft hyphen), so that two names that look the same are the same.
func Clean(s string) string {
	s = strings.ToValidUTF8(s, string(Replacement))
	if strings.IndexFunc(s, Unsafe) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if Unsafe(r) {
			return Replacement
		}
		return r
	}, s)
}

// Unsafe reports whether Clean replaces r.
func Unsafe(r rune) bool {
	switch {
	case r < 0x20 || r == 0x7f: // C0, DEL
		return true
	case r >= 0x80 && r <= 0x9f: // C1
		return true
	}
	return unicode.Is(unicode.Cf, r)
}

// Cut is Clean(s) cut to at most max bytes on a character boundary, with
// "..." in place of what was cut; s is read no further than it needs.
func Cut(s string, max int) string {
	if max < 4 {
		max = 4
	}
	if len(s) > 4*max {
		s = s[:4*max] // Clean grows a byte to at most 3: read no more than this
	}
	s = Clean(s)
	if len(s) <= max {
		return s
	}
	end := max - 3
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + "..."
}
