"""Names vulture reports as unused that are used: read by a library or the API server, written out
whole (dataclasses serialised with asdict / JSON), or a protocol's signature. Run by `make lint`.
A name belongs here only with its reason; dead code is deleted instead."""

# ruff: noqa
_ = object()

# Serialised whole with asdict (the agent's /snapshot JSON, the fault-latency bench's report rows).
last_xid_time  # agent/faults.py: GpuFaults, in the agent snapshot
last_dbe_time  # agent/faults.py: GpuFaults, in the agent snapshot
container_id  # agent/pods.py: PodAttribution, in the agent snapshot
t_sample_before  # bench/fault_latency.py: Run, asdict() into the report
cycle_seconds  # bench/fault_latency.py: Run, asdict() into the report
_.cycle_seconds
_.t_sample_before

# Catalogues kept complete so they read as the vendor's tables (NVML return codes, DCGM fields,
# taint effects); a value the code does not name today is still a valid input.
INVALID_ARGUMENT  # agent/nvml/types.py
NO_PERMISSION
RESET_REQUIRED
LIB_RM_VERSION_MISMATCH
NO_DATA
PREFER_NO_SCHEDULE  # api/policy/faults.py: FaultEffect
CLOUD_EVENTS  # api/policy/notify.py: SinkType, chosen by value in a policy
INDEX  # sim/catalog.py: DCGM field catalogue
APPLICATIONS_CLOCKS_SETTING
SYNC_BOOST
DISPLAY_CLOCK

# Schema fields of the scenario file (pydantic): read by validation, named by scenario YAML.
pod_not_evicted
pod_annotation
node_condition
policy_condition
workload_object

# Record fields written and not read yet. activity_peak: the judge fills it (engine/reclaim/judge.py)
# beside activity_avg as the verdict's evidence; deleting it touches the judge's wide constructor
# calls, which the keyword-only step of issue 34 rewrites. first_seen: kept for
# debugging the harness.
activity_peak  # engine/model.py: PodVerdict
first_seen  # sim/observation.py: PodRecord

# Attributes a library reads (kubernetes Configuration, requests Session, Kopf settings).
_.connection_pool_maxsize
_.server_timeout

# Methods and parameters a protocol requires (io.RawIOBase, NVML and urllib3 signatures, __exit__).
_.readable
_.readinto
_.uiVal
event_set
timeout_ms
amt
decode_content
tb

# Read by people: the version of NVIDIA's XID catalogue the table was written from.
CATALOGUE_VERSION  # engine/quarantine/xid_catalogue.py

# Served by the harness simulator and the node agent, not read by the operator (api/exporter_fields.py).
EXTRA_RENAMES
CLOCK_EVENT_LABEL
WINDOW_LABEL
sys_version  # http.server's Server header (selfservice/server.py)

# Policy fields read by name (api/policy/reclaim.py: OwnerActions.for_kind, through its kind table).
replica_set
stateful_set
job_set
leader_worker_set
inference_service
ray_cluster
ray_job
py_torch_job
mpi_job
tf_job
train_job
