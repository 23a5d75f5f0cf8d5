package wire

import "strings"

// NormalizeUUID turns the three spellings a client may use into NVML's:
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (kept, prefix case fixed),
// bare dashed hex (prefixed with GPU-) and 32 hex digits (dashed and
// prefixed). MIG-… UUIDs are kept as they are. It returns false for
// anything else.
func NormalizeUUID(s string) (string, bool) {
	if isNVMLSpelling(s) {
		return s, true // as clients mostly send it: nothing to allocate
	}
	return normalizeUUID(s)
}

func normalizeUUID(s string) (string, bool) {
	s = strings.TrimSpace(s)
	upper := strings.ToUpper(s)
	switch {
	case strings.HasPrefix(upper, "MIG-"):
		rest := s[4:]
		if rest == "" || len(rest) > 128 {
			return "", false
		}
		return "MIG-" + rest, true
	case strings.HasPrefix(upper, "GPU-"):
		s = s[4:]
	}
	hex := strings.ReplaceAll(s, "-", "")
	if len(hex) != 32 || !isHex(hex) {
		return "", false
	}
	if strings.Contains(s, "-") && !isCanonicalDashed(s) {
		return "", false
	}
	hex = strings.ToLower(hex)
	return "GPU-" + hex[0:8] + "-" + hex[8:12] + "-" + hex[12:16] + "-" + hex[16:20] + "-" + hex[20:32], true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func isCanonicalDashed(s string) bool {
	if len(s) != 36 {
		return false
	}
	for _, i := range []int{8, 13, 18, 23} {
		if s[i] != '-' {
			return false
		}
	}
	return true
}

// isNVMLSpelling reports whether s is already NVML's spelling of a GPU
// UUID: "GPU-" and lower-case dashed hex.
func isNVMLSpelling(s string) bool {
	if len(s) != 40 || s[:4] != "GPU-" {
		return false
	}
	for i := 4; i < len(s); i++ {
		switch c := s[i]; i - 4 {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}
