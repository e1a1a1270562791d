"""What a request's tokens become on the way out (§3, §4): stream writers and detokenizing."""
