module github.com/gpu-efficiency-operator/hack/localcluster/helm

go 1.26.0

require helm.sh/helm/v3 v3.22.0
