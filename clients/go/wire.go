package lockservice

import (
	"math"
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
	us := int64(d / time.Microsecond)
	if d%time.Microsecond >= 500*time.Nanosecond {
		us++ // (no overflow: d is at most MaxInt64 ns)
	}
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

// addSat is a+b for non-negative durations, saturated at the largest
// Duration instead of wrapping round to a negative one.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Seconds is a lease or a wait as the wire writes it: decimal seconds to
// the microsecond, never with an exponent (a positive value is at least
// 0.000001), with no upper bound of its own. A time.Duration stops at about
// 292 years; a Seconds does not, so a number taken from elsewhere (a
// configuration file, a JSON command) reaches the node as it was given and
// the node judges it against its own maxima (ErrRejected beyond them).
// The zero Seconds is 0.
type Seconds struct {
	text string        // the wire field; "" for 0
	d    time.Duration // the same, saturated at the largest Duration
}

// SecondsOf is d as Seconds (0 for a negative d).
func SecondsOf(d time.Duration) Seconds {
	if d <= 0 {
		return Seconds{}
	}
	return Seconds{text: formatSeconds(d), d: d}
}

// ParseSeconds reads a non-negative number of seconds written in decimal,
// with an optional fraction and exponent as in JSON ("30", "0.5", "1e21",
// "2.5E-3"), exactly, to the microsecond (half away from zero; a positive
// value is at least 0.000001). It fails with ErrInvalid on anything else: a
// negative value, or one too large to be a float64 at all.
func ParseSeconds(s string) (Seconds, error) {
	bad := func(why string) (Seconds, error) {
		return Seconds{}, newError(ErrInvalid, "parse seconds", "", strconv.Quote(s)+": "+why)
	}
	// -?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?
	i, n := 0, len(s)
	neg := i < n && s[i] == '-'
	if neg {
		i++
	}
	digits := func() int {
		j := i
		for i < n && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i - j
	}
	intStart := i
	if digits() == 0 {
		return bad("not a decimal number")
	}
	intPart := s[intStart:i]
	fracPart := ""
	if i < n && s[i] == '.' {
		i++
		j := i
		if digits() == 0 {
			return bad("not a decimal number")
		}
		fracPart = s[j:i]
	}
	exp := 0
	if i < n && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < n && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		j := i
		if digits() == 0 {
			return bad("not a decimal number")
		}
		e, err := strconv.Atoi(s[j:i])
		if err != nil || e > 1<<20 {
			e = 1 << 20 // far beyond any float64: decided below
		}
		if eneg {
			e = -e
		}
		exp = e
	}
	if i != n {
		return bad("not a decimal number")
	}
	// The value is mant * 10^exp, mant an integer in decimal.
	mant := strings.TrimLeft(intPart+fracPart, "0")
	exp -= len(fracPart)
	if mant == "" {
		return Seconds{}, nil // zero (also "-0")
	}
	if neg {
		return bad("must be >= 0")
	}
	if len(mant)+exp > 309 {
		return bad("too large") // beyond any float64 (1.8e308)
	}
	if f, err := strconv.ParseFloat(s, 64); err != nil && math.IsInf(f, 0) {
		return bad("too large")
	}
	// Microseconds: mant * 10^(exp+6), rounded half away from zero.
	var us string
	if shift := exp + 6; shift >= 0 {
		us = mant + strings.Repeat("0", shift)
	} else if drop := -shift; drop >= len(mant) {
		us = "" // below half a microsecond or about it: at least 1 below
	} else {
		us = mant[:len(mant)-drop]
		if mant[len(mant)-drop] >= '5' {
			us = incDecimal(us)
		}
	}
	us = strings.TrimLeft(us, "0")
	if us == "" {
		us = "1" // positive: never written as 0
	}
	if len(us) <= 6 {
		us = strings.Repeat("0", 7-len(us)) + us
	}
	whole, frac := us[:len(us)-6], strings.TrimRight(us[len(us)-6:], "0")
	text := whole
	if frac != "" {
		text += "." + frac
	}
	return Seconds{text: text, d: durationOf(whole, us[len(us)-6:])}, nil
}

// incDecimal adds one to a string of decimal digits.
func incDecimal(s string) string {
	b := []byte(s)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < '9' {
			b[i]++
			return string(b)
		}
		b[i] = '0'
	}
	return "1" + string(b)
}

// durationOf is whole seconds plus six digits of microseconds as a
// Duration, saturated at the largest one.
func durationOf(whole, micros string) time.Duration {
	const maxWhole = math.MaxInt64 / int64(time.Second)
	if len(whole) > 19 {
		return math.MaxInt64
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > maxWhole {
		return math.MaxInt64
	}
	us, _ := strconv.ParseInt(micros, 10, 64)
	return addSat(time.Duration(w)*time.Second, time.Duration(us)*time.Microsecond)
}

// String is the value in the wire's seconds grammar ("0" for zero).
func (s Seconds) String() string {
	if s.text == "" {
		return "0"
	}
	return s.text
}

// Duration is the value as a time.Duration, saturated at the largest one
// (about 292 years).
func (s Seconds) Duration() time.Duration { return s.d }

// IsZero reports whether the value is 0.
func (s Seconds) IsZero() bool { return s.text == "" }

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
