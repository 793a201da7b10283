package lockservice

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxKey is the longest key, name or election in bytes.
const MaxKey = 250

// MaxSlots is the largest semaphore.
const MaxSlots = 65535

// instanceHex is the length of the "#<instance id>" suffix's id.
const instanceHex = 12

// validKey reports whether s is 1–250 bytes of UTF-8 with no space and no
// control character (Unicode category Cc).
func validKey(s string) bool {
	if len(s) == 0 || len(s) > MaxKey || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == ' ' || r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return true
}

// formatSeconds writes d in the wire's seconds grammar, to the microsecond,
// never with an exponent; a positive duration is at least 0.000001.
func formatSeconds(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	us := int64((d + 500*time.Nanosecond) / time.Microsecond)
	if us == 0 {
		us = 1
	}
	s := strconv.FormatInt(us/1e6, 10)
	frac := us % 1e6
	if frac == 0 {
		return s
	}
	f := strings.TrimRight(strconv.FormatInt(frac+1e6, 10)[1:], "0")
	return s + "." + f
}

// Share says how a key is shared: Exclusive (the zero value),
// Read, or Semaphore(n).
type Share int

const (
	// Exclusive: one holder at a time (also the writer of a read-write key).
	Exclusive Share = 0
	// Read: a read lock, held beside other readers but never beside a writer.
	Read Share = -1
)

// Semaphore is one of n slots (2..65535) of a semaphore key; every acquirer
// of that key must give the same n. Semaphore(1) is Exclusive.
func Semaphore(n int) Share {
	if n == 1 {
		return Exclusive
	}
	if n < 2 || n > MaxSlots {
		return Share(-2) // invalid, refused by Acquire
	}
	return Share(n)
}

// String is "exclusive", "r" or the semaphore's slot count.
func (s Share) String() string {
	switch {
	case s == Exclusive || s == 1:
		return "exclusive"
	case s == Read:
		return "r"
	default:
		return strconv.Itoa(int(s))
	}
}

// field is the optional fifth field of A: "" for exclusive.
func (s Share) field() (string, bool) {
	switch {
	case s == Exclusive || s == 1:
		return "", true
	case s == Read:
		return " r", true
	case s >= 2 && s <= MaxSlots:
		return " " + strconv.Itoa(int(s)), true
	}
	return "", false
}

// ParseToken parses a decimal fencing token (leading zeros allowed, at most
// 2^64-1).
func ParseToken(s string) (uint64, error) {
	if s == "" || len(s) > 40 {
		return 0, newError(ErrInvalid, "parse token", "", "not a decimal token: "+strconv.Quote(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, newError(ErrInvalid, "parse token", "", "not a decimal token: "+strconv.Quote(s))
		}
	}
	t := strings.TrimLeft(s, "0")
	if t == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, newError(ErrInvalid, "parse token", "", "token out of range: "+s)
	}
	return v, nil
}

// nameValue is a connection name's value: the part before its last '#'
// (the whole name when it has none).
func nameValue(name string) string {
	if i := strings.LastIndexByte(name, '#'); i >= 0 {
		return name[:i]
	}
	return name
}
