//go:build tools

// Package tools pins the KWOK controller built by ../build.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
