package natsconn

import (
	"net/url"
	"slices"
	"strings"
)

// redacted stands in for the user information of a URL.
const redacted = "redacted"

// Redact returns url, a NATS URL or a comma-separated list of them, with
// the user information of each element (a user and password, or a token:
// everything between "scheme://" and the element's last "@") replaced by
// "redacted". It works on the text, not on a parsed URL, so a string that
// does not parse as a URL (the very case an error message shows) is
// redacted too.
//
// NATS clients split a list on every comma, so a comma inside a password
// must be percent-encoded to work at all. Redact still reads a part that
// holds an "@" but does not start with "scheme://" as the rest of the
// element before it (what an unencoded comma in a password leaves behind)
// and redacts them together: showing less is the safe way to be wrong.
func Redact(url string) string {
	elems := elements(url)
	for i, e := range elems {
		if start, end, ok := userInfo(e); ok {
			elems[i] = e[:start] + redacted + e[end:]
		}
	}
	return strings.Join(elems, ",")
}

// elements splits a URL list on commas, keeping together the parts that
// Redact reads as one element.
func elements(list string) []string {
	parts := strings.Split(list, ",")
	out := make([]string, 0, len(parts))
	for i := 0; i < len(parts); {
		end := i + 1
		for k := i + 1; k < len(parts) && schemeEnd(parts[k]) < 0; k++ {
			if strings.Contains(parts[k], "@") {
				end = k + 1
			}
		}
		out = append(out, strings.Join(parts[i:end], ","))
		i = end
	}
	return out
}

// schemeEnd returns the index just after "scheme://" when e, after leading
// blanks, starts with one, and -1 otherwise. A "://" after text that
// cannot be a scheme (it holds ':' or '@', say) is inside a password.
func schemeEnd(e string) int {
	i := strings.Index(e, "://")
	if i < 0 {
		return -1
	}
	scheme := strings.TrimLeft(e[:i], " \t")
	if scheme == "" {
		return -1
	}
	for j, r := range scheme {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (j == 0 || !(r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')) {
			return -1
		}
	}
	return i + len("://")
}

// userInfo returns where the user information of element e starts and
// where it ends (at the last '@'); ok is false when e has none.
func userInfo(e string) (start, end int, ok bool) {
	end = strings.LastIndex(e, "@")
	if end < 0 {
		return 0, 0, false
	}
	start = schemeEnd(e)
	if start < 0 || start > end {
		// No scheme: everything before the '@' but leading blanks.
		start = min(len(e)-len(strings.TrimLeft(e, " \t")), end)
	}
	return start, end, true
}

// secrets returns the user information of every element of list, and its
// password or token raw and percent-decoded, for scrubbing from text that
// may quote them (an error of the client library).
func secrets(list string) []string {
	var out []string
	for _, e := range elements(list) {
		start, end, ok := userInfo(e)
		if !ok {
			continue
		}
		info := strings.TrimSpace(e[start:end])
		if info == "" {
			continue
		}
		out = append(out, info)
		secret := info
		if _, pass, ok := strings.Cut(info, ":"); ok {
			secret = pass
		}
		out = append(out, secret)
		if dec, err := url.PathUnescape(secret); err == nil {
			out = append(out, dec)
		}
	}
	return out
}

// scrub returns text with every element of list that holds user
// information, and every secret in it, replaced by its redacted form.
func scrub(text, list string) string {
	var olds []string
	for _, e := range elements(list) {
		if e = strings.TrimSpace(e); strings.Contains(e, "@") {
			olds = append(olds, e)
		}
	}
	olds = append(olds, secrets(list)...)
	// Longest first, so that a secret inside a longer one (a password
	// inside "user:password") does not leave the rest behind.
	slices.SortStableFunc(olds, func(a, b string) int { return len(b) - len(a) })
	for _, o := range olds {
		switch {
		case o == "":
		case strings.Contains(o, "@"):
			text = strings.ReplaceAll(text, o, Redact(o))
		default:
			text = strings.ReplaceAll(text, o, redacted)
		}
	}
	return text
}
