package baton

import (
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The server's limits, as the other clients hold them.
const (
	ResourceNameLenBytesMax = 512
	HolderLenBytesMax       = 256
	// DurationMax is the longest TTL or wait any client accepts.
	DurationMax = 365 * 24 * time.Hour
)

// invisibleRanges are the code points no new name or holder description
// may hold: Unicode category Cf and the other Default_Ignorable_Code_Point
// code points (bidi overrides, zero-width characters, variation
// selectors, fillers, tags). They make one name look like another. The
// server's table (baton_core::invisible); crates/fence/tests/it/sql_names.rs
// checks that this one is the same.
var invisibleRanges = [][2]rune{
	{0x00AD, 0x00AD},
	{0x034F, 0x034F},
	{0x0600, 0x0605},
	{0x061C, 0x061C},
	{0x06DD, 0x06DD},
	{0x070F, 0x070F},
	{0x0890, 0x0891},
	{0x08E2, 0x08E2},
	{0x115F, 0x1160},
	{0x17B4, 0x17B5},
	{0x180B, 0x180F},
	{0x200B, 0x200F},
	{0x202A, 0x202E},
	{0x2060, 0x206F},
	{0x3164, 0x3164},
	{0xFE00, 0xFE0F},
	{0xFEFF, 0xFEFF},
	{0xFFA0, 0xFFA0},
	{0xFFF0, 0xFFFB},
	{0x110BD, 0x110BD},
	{0x110CD, 0x110CD},
	{0x13430, 0x1343F},
	{0x1BCA0, 0x1BCA3},
	{0x1D173, 0x1D17A},
	{0xE0000, 0xE0FFF},
}

const invisibleRule = "characters of Unicode category Cf and default-ignorable code points " +
	"(bidi overrides, zero-width characters) are not allowed: " +
	"they make one name look like another"

// control is the first control character (Unicode Cc) and its byte offset.
func control(text string) (rune, int, bool) {
	for at, c := range text {
		if c < 0x20 || (c >= 0x7F && c <= 0x9F) {
			return c, at, true
		}
	}
	return 0, 0, false
}

// invisible is the first invisible or formatting character and its byte offset.
func invisible(text string) (rune, int, bool) {
	for at, c := range text {
		if c <= 0x7F {
			continue
		}
		for _, r := range invisibleRanges {
			if r[0] <= c && c <= r[1] {
				return c, at, true
			}
		}
	}
	return 0, 0, false
}

// CheckResource is the canonical (NFC) form of a resource name, or an
// [ErrInvalid] naming the rule it breaks, with the server's messages.
// existing: a name that may already be held (status, fence, release),
// where a name stored before invisible characters were refused passes.
func CheckResource(raw string, existing bool) (string, error) {
	if plainASCII(raw) {
		return raw, nil
	}
	if raw == "" {
		return "", invalidf("resource name is empty")
	}
	if !utf8.ValidString(raw) {
		return "", invalidf("resource name is not valid UTF-8")
	}
	name := norm.NFC.String(raw)
	if n := len(name); n > ResourceNameLenBytesMax {
		return "", invalidf("resource name is %d bytes long; the limit is %d bytes (after NFC normalization)",
			n, ResourceNameLenBytesMax)
	}
	if c, at, found := control(name); found {
		return "", invalidf("resource name contains control character U+%04X at byte %d; control characters are not allowed", c, at)
	}
	if !existing {
		if c, at, found := invisible(name); found {
			return "", invalidf("resource name contains invisible or formatting character U+%04X at byte %d; %s", c, at, invisibleRule)
		}
	}
	if name != strings.TrimSpace(name) {
		return "", invalidf("resource name has leading or trailing whitespace; trim it")
	}
	at := 0
	for _, segment := range strings.Split(name, ":") {
		if segment == "" {
			return "", invalidf("resource name has an empty ':'-separated segment at byte %d; segments must be non-empty", at)
		}
		at += len(segment) + 1
	}
	return name, nil
}

// CheckHolder is a holder description as sent, or an [ErrInvalid] naming
// the rule it breaks.
func CheckHolder(raw string) (string, error) {
	if raw == "" {
		return "", invalidf("holder description is empty; omit it instead")
	}
	if !utf8.ValidString(raw) {
		return "", invalidf("holder description is not valid UTF-8")
	}
	if n := len(raw); n > HolderLenBytesMax {
		return "", invalidf("holder description is %d bytes long; the limit is %d bytes", n, HolderLenBytesMax)
	}
	if c, at, found := control(raw); found {
		return "", invalidf("holder description contains control character U+%04X at byte %d; control characters are not allowed", c, at)
	}
	if c, at, found := invisible(raw); found {
		return "", invalidf("holder description contains invisible or formatting character U+%04X at byte %d; %s", c, at, invisibleRule)
	}
	return raw, nil
}

// millis is d in whole milliseconds, or an [ErrInvalid] naming the rule:
// at most a year, a whole number of milliseconds, and above 0 unless
// zeroOK.
func millis(d time.Duration, what string, zeroOK bool) (uint64, error) {
	switch {
	case d < 0:
		return 0, invalidf("%s %v is negative", what, d)
	case d == 0 && !zeroOK:
		return 0, invalidf("%s is 0 ms: a lease's TTL is above 0", what)
	case d > DurationMax:
		return 0, invalidf("%s %v: it must be at most 365 days (%d ms)", what, d, DurationMax.Milliseconds())
	case d%time.Millisecond != 0:
		return 0, invalidf("%s %v is not a whole number of milliseconds", what, d)
	}
	return uint64(d.Milliseconds()), nil
}

// checkPrefix is a list's or a watch's prefix: no longer than a name, no
// control character (no name holds one, so it could match nothing).
func checkPrefix(prefix string) error {
	if n := len(prefix); n > ResourceNameLenBytesMax {
		return invalidf("prefix is %d bytes long; the limit is %d bytes", n, ResourceNameLenBytesMax)
	}
	if c, at, found := control(prefix); found {
		return invalidf("prefix contains control character U+%04X at byte %d; names never do", c, at)
	}
	return nil
}

// plainASCII is the common case, checked at once: printable ASCII
// (already NFC, nothing invisible), no surrounding space, no empty
// segment, within the length limit.
func plainASCII(name string) bool {
	n := len(name)
	if n == 0 || n > ResourceNameLenBytesMax || name[0] == ' ' || name[n-1] == ' ' || name[0] == ':' || name[n-1] == ':' {
		return false
	}
	for i := 0; i < n; i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e || (c == ':' && name[i-1] == ':') {
			return false
		}
	}
	return true
}
