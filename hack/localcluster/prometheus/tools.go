//go:build tools

// Package tools pins the Prometheus server and promtool built by ../build.sh (the local cluster's
// Prometheus; `-tags remove_all_sd` leaves out the cloud service discoveries it does not use).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
