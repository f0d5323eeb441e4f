//go:build tools

// Package tools pins the VictoriaMetrics single-node server and vmagent built by
// ../build-victoriametrics.sh (the local cluster's optional PromQL store). The cluster version's
// vminsert/vmselect/vmstorage programs live only under `-cluster` tags, which the module proxy does
// not serve.
package tools

import (
	_ "github.com/VictoriaMetrics/VictoriaMetrics/app/victoria-metrics"
	_ "github.com/VictoriaMetrics/VictoriaMetrics/app/vmagent"
)
