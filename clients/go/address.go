package baton

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// PortDefault is the port of an address written without one.
const PortDefault = 7700

const addressRule = "write HOST, HOST:PORT, [IPv6]:PORT, a bare PORT (on 127.0.0.1), " +
	"or a URL with http:// or https://"

// Address is host:port as gRPC dials it, from an address as users write
// it: HOST and http://HOST mean port 7700, a bare PORT means
// 127.0.0.1:PORT, [::1] and [::1]:PORT are IPv6. Anything else is an
// error naming the rule (the other clients' rule, with their messages).
func Address(url string) (string, error) {
	text := strings.TrimSpace(url)
	where := fmt.Sprintf("server address %q", text)
	rest := text
	if scheme, after, found := strings.Cut(text, "://"); found {
		if s := strings.ToLower(scheme); s != "http" && s != "https" {
			return "", invalidf("%s: the scheme %q is not http or https; %s", where, scheme, addressRule)
		}
		rest = after
	}
	authority := strings.TrimSuffix(rest, "/")
	if authority == "" || strings.ContainsAny(authority, "/?#@") {
		return "", invalidf("%s: not an address; %s", where, addressRule)
	}
	if rest == text && allDigits(authority) {
		port, err := parsePort(authority, where)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("127.0.0.1:%d", port), nil
	}
	var host, portText string
	hasPort := false
	if strings.HasPrefix(authority, "[") {
		inside, after, closed := strings.Cut(authority[1:], "]")
		if !closed {
			return "", invalidf("%s: an IPv6 address needs its closing ']'; %s", where, addressRule)
		}
		if ip, err := netip.ParseAddr(inside); err != nil || !ip.Is6() {
			return "", invalidf("%s: [%s] is not an IPv6 address", where, inside)
		}
		if after != "" && !strings.HasPrefix(after, ":") {
			return "", invalidf("%s: expected ':PORT' after the IPv6 address; %s", where, addressRule)
		}
		host = "[" + inside + "]"
		if after != "" {
			portText, hasPort = after[1:], true
		}
	} else {
		var found bool
		host, portText, found = strings.Cut(authority, ":")
		if strings.Contains(portText, ":") {
			return "", invalidf("%s: write an IPv6 address in brackets, like [::1]:7700; %s", where, addressRule)
		}
		hasPort = found
	}
	if host == "" {
		return "", invalidf("%s: no host; %s", where, addressRule)
	}
	port := PortDefault
	if hasPort {
		p, err := parsePort(portText, where)
		if err != nil {
			return "", err
		}
		port = p
	}
	return fmt.Sprintf("%s:%d", host, port), nil
}

func allDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func parsePort(text, where string) (int, error) {
	if !allDigits(text) {
		return 0, invalidf("%s: port %q is not a number; a port is 1 to 65535", where, text)
	}
	port, err := strconv.Atoi(text)
	if err != nil || port < 1 || port > 65535 {
		return 0, invalidf("%s: port %s is out of range; a port is 1 to 65535", where, text)
	}
	return port, nil
}
