"""The XID catalogue: every XID code NVIDIA documents, what it means, and what NVIDIA says to do.

Written by us from NVIDIA's public "Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, the Ampere-and-newer table, column "Resolution Bucket (Immediate
Action)"), cross-checked code by code against the mapping NVIDIA ships with NVSentinel
(github.com/NVIDIA/NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/
xiderrorsmapping.csv at commit 6f8b0fcf, which names NVIDIA's CONTACT_SUPPORT bucket
UNEXPECTED_ERR_REPORT_ISSUE). Catalogue version below: codes 1-162 as of that commit (2025).

Each entry keeps NVIDIA's mnemonic and bucket verbatim and maps the bucket to one of our
resolution classes (``XidResolution``), the unit policies choose by:

- RESTART_BM and RESTART_VM: reboot-node (a VM is its node);
- WORKFLOW_XID_48 (double-bit ECC) and the NVLink workflows (WORKFLOW_NVLINK_ERR,
  WORKFLOW_NVLINK5_ERR): reset-gpu, the step those workflows end in when the error is real;
- WORKFLOW_XID_45 (preemptive channel removal, which follows an application's exit or another
  XID): restart-app;
- CHECK_MECHANICALS: check-hardware; UPDATE_SWFW: update-software; CHECK_UVM and XID 154
  ("follow the guidance of the XID it names"): investigate.

A code missing here (a newer driver) has class unknown: it taints only if a policy lists it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpu_efficiency.api.policy import XidFault, XidResolution
from gpu_efficiency.engine.quarantine.record import GpuFault

#: Where the table comes from, for messages and the README.
CATALOGUE_VERSION = "NVIDIA Xid Catalog, codes 1-162 (NVSentinel xiderrorsmapping.csv @ 6f8b0fcf)"

_BUCKETS: Mapping[str, XidResolution] = {
    "IGNORE": XidResolution.IGNORE,
    "RESTART_APP": XidResolution.RESTART_APP,
    "RESET_GPU": XidResolution.RESET_GPU,
    "RESTART_BM": XidResolution.REBOOT_NODE,
    "RESTART_VM": XidResolution.REBOOT_NODE,
    "CONTACT_SUPPORT": XidResolution.CONTACT_SUPPORT,
    "CHECK_MECHANICALS": XidResolution.CHECK_HARDWARE,
    "UPDATE_SWFW": XidResolution.UPDATE_SOFTWARE,
    "CHECK_UVM": XidResolution.INVESTIGATE,
    "XID_154_EVAL": XidResolution.INVESTIGATE,
    "WORKFLOW_XID_45": XidResolution.RESTART_APP,
    "WORKFLOW_XID_48": XidResolution.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": XidResolution.RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": XidResolution.RESET_GPU,
}

#: What to do, per class: the second half of every XID message.
ACTIONS: Mapping[XidResolution, str] = {
    XidResolution.IGNORE: "no action needed",
    XidResolution.RESTART_APP: "restart the application; the GPU itself is fine",
    XidResolution.RESET_GPU: "drain the GPU and reset it (nvidia-smi -r), then mark it recovered",
    XidResolution.REBOOT_NODE: "drain and reboot the node, then mark it recovered",
    XidResolution.CONTACT_SUPPORT: "drain the node and contact NVIDIA support with an nvidia-bug-report",
    XidResolution.CHECK_HARDWARE: "check the node's power and cooling",
    XidResolution.UPDATE_SOFTWARE: "update the GPU driver and firmware",
    XidResolution.INVESTIGATE: "read the driver log: the action depends on the XID it names",
    XidResolution.UNKNOWN: "not in the operator's XID catalogue: check NVIDIA's XID catalog",
}

#: Classes of application-level XIDs: a burst of them across nodes is one crashing job.
APPLICATION_CLASSES = frozenset({XidResolution.RESTART_APP, XidResolution.IGNORE})


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalogue entry."""

    code: int
    mnemonic: str  # NVIDIA's
    bucket: str  # NVIDIA's resolution bucket (immediate action)
    meaning: str  # ours, short

    @property
    def resolution(self) -> XidResolution:
        return _BUCKETS[self.bucket]

    @property
    def action(self) -> str:
        return ACTIONS[self.resolution]


def _x(code: int, mnemonic: str, bucket: str, meaning: str) -> XidInfo:
    return XidInfo(code, mnemonic, bucket, meaning)


_ENTRIES = (
    _x(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", "CONTACT_SUPPORT", "fifo error fifo method"),
    _x(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", "CONTACT_SUPPORT", "fifo error sw method"),
    _x(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", "CONTACT_SUPPORT", "fifo error unk method"),
    _x(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", "CONTACT_SUPPORT", "fifo error channel busy"),
    _x(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", "CONTACT_SUPPORT", "fifo error runout overflow"),
    _x(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", "CONTACT_SUPPORT", "fifo error parse err"),
    _x(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", "CONTACT_SUPPORT", "fifo error pte err"),
    _x(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "RESTART_APP",
        "GPU stopped processing (channel idle timeout)",
    ),
    _x(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", "CONTACT_SUPPORT", "gr error instance"),
    _x(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", "CONTACT_SUPPORT", "gr error single step"),
    _x(
        11,
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW",
        "RESTART_APP",
        "invalid or corrupted push buffer: missing hardware class",
    ),
    _x(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", "CONTACT_SUPPORT", "gr error sw method"),
    _x(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "RESTART_APP",
        "graphics engine exception (SM warp exception, illegal instruction or out-of-range address in the application)",
    ),
    _x(14, "ROBUST_CHANNEL_FAKE_ERROR", "IGNORE", "fake error injected for testing"),
    _x(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", "CONTACT_SUPPORT", "scanline timeout"),
    _x(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "CONTACT_SUPPORT", "vblank callback timeout"),
    _x(17, "ROBUST_CHANNEL_PARAMETER_ERROR", "CONTACT_SUPPORT", "parameter error"),
    _x(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", "CONTACT_SUPPORT", "bus master timeout error"),
    _x(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", "CONTACT_SUPPORT", "disp missed notifier"),
    _x(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", "CONTACT_SUPPORT", "mpeg error sw method"),
    _x(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", "CONTACT_SUPPORT", "me error sw method"),
    _x(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", "CONTACT_SUPPORT", "vp error sw method"),
    _x(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", "CONTACT_SUPPORT", "rc logging enabled"),
    _x(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", "CONTACT_SUPPORT", "gr semaphore timeout"),
    _x(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "RESTART_APP", "illegal graphics notify from the application"),
    _x(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", "CONTACT_SUPPORT", "fifo error fbistate timeout"),
    _x(27, "ROBUST_CHANNEL_VP_ERROR", "CONTACT_SUPPORT", "vp error"),
    _x(28, "ROBUST_CHANNEL_VP2_ERROR", "CONTACT_SUPPORT", "vp2 error"),
    _x(29, "ROBUST_CHANNEL_BSP_ERROR", "CONTACT_SUPPORT", "bsp error"),
    _x(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", "CONTACT_SUPPORT", "bad addr access"),
    _x(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "RESTART_APP",
        "GPU memory page fault (MMU fault): usually the application accessed an illegal address",
    ),
    _x(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "RESTART_APP",
        "invalid or corrupted push buffer stream (PBDMA error)",
    ),
    _x(33, "ROBUST_CHANNEL_SEC_ERROR", "CONTACT_SUPPORT", "sec error"),
    _x(34, "ROBUST_CHANNEL_MSVLD_ERROR", "CONTACT_SUPPORT", "msvld error"),
    _x(35, "ROBUST_CHANNEL_MSPDEC_ERROR", "CONTACT_SUPPORT", "mspdec error"),
    _x(36, "ROBUST_CHANNEL_MSPPP_ERROR", "CONTACT_SUPPORT", "msppp error"),
    _x(
        37,
        "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD",
        "IGNORE",
        "driver firmware: unimplemented firmware method",
    ),
    _x(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "IGNORE", "driver firmware watchdog timeout"),
    _x(39, "ROBUST_CHANNEL_CE0_ERROR", "RESTART_APP", "copy engine 0 exception"),
    _x(40, "ROBUST_CHANNEL_CE1_ERROR", "RESTART_APP", "copy engine 1 exception"),
    _x(41, "ROBUST_CHANNEL_CE2_ERROR", "RESTART_APP", "copy engine 2 exception"),
    _x(42, "ROBUST_CHANNEL_VIC_ERROR", "CONTACT_SUPPORT", "vic error"),
    _x(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "IGNORE",
        "GPU stopped processing: the channel was reset after an application error",
    ),
    _x(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "IGNORE", "graphics engine fault during a context switch"),
    _x(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "WORKFLOW_XID_45",
        "preemptive cleanup: the channel was removed because the application exited or a previous error stopped it",
    ),
    _x(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU", "GPU stopped processing (GPU timeout)"),
    _x(47, "ROBUST_CHANNEL_NVENC0_ERROR", "CONTACT_SUPPORT", "video encoder (NVENC0) exception"),
    _x(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "WORKFLOW_XID_48",
        "double-bit ECC error (uncorrectable memory error)",
    ),
    _x(
        49,
        "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY",
        "CONTACT_SUPPORT",
        "silent running constant level set by registry",
    ),
    _x(
        50,
        "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR",
        "CONTACT_SUPPORT",
        "silent running level transition due to rc error",
    ),
    _x(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", "CONTACT_SUPPORT", "silent running stress test failure"),
    _x(
        52,
        "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE",
        "CONTACT_SUPPORT",
        "silent running level trans due to temp rise",
    ),
    _x(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", "CONTACT_SUPPORT", "silent running temp reduced clocking"),
    _x(
        54,
        "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
        "CHECK_MECHANICALS",
        "power-reduced clocking: check power and cooling",
    ),
    _x(
        55,
        "SILENT_RUNNING_TEMPERATURE_READ_ERROR",
        "CONTACT_SUPPORT",
        "silent running temperature read error",
    ),
    _x(56, "DISPLAY_CHANNEL_EXCEPTION", "CONTACT_SUPPORT", "display channel exception"),
    _x(57, "FB_LINK_TRAINING_FAILURE_ERROR", "CONTACT_SUPPORT", "fb link training failure error"),
    _x(58, "FB_MEMORY_ERROR", "CONTACT_SUPPORT", "fb memory error"),
    _x(59, "PMU_ERROR", "CONTACT_SUPPORT", "pmu error"),
    _x(60, "ROBUST_CHANNEL_SEC2_ERROR", "RESTART_APP", "security engine (SEC2) exception"),
    _x(61, "PMU_BREAKPOINT", "CONTACT_SUPPORT", "pmu breakpoint"),
    _x(62, "PMU_HALT_ERROR", "RESET_GPU", "internal micro-controller (PMU) halted"),
    _x(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "IGNORE",
        "ECC page retirement or row remapping recorded: takes effect after a GPU reset",
    ),
    _x(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", "ECC page retirement or row remapping failed"),
    _x(65, "ROBUST_CHANNEL_NVENC1_ERROR", "CONTACT_SUPPORT", "video encoder (NVENC1) exception"),
    _x(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "IGNORE", "firmware register access violation"),
    _x(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "IGNORE", "firmware verification violation"),
    _x(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "RESTART_APP", "video decoder (NVDEC0) exception"),
    _x(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP", "graphics engine class error"),
    _x(70, "ROBUST_CHANNEL_CE3_ERROR", "RESTART_APP", "copy engine 3 exception"),
    _x(71, "ROBUST_CHANNEL_CE4_ERROR", "RESTART_APP", "copy engine 4 exception"),
    _x(72, "ROBUST_CHANNEL_CE5_ERROR", "RESTART_APP", "copy engine 5 exception"),
    _x(73, "ROBUST_CHANNEL_NVENC2_ERROR", "CONTACT_SUPPORT", "video encoder (NVENC2) exception"),
    _x(74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", "NVLink error"),
    _x(75, "ROBUST_CHANNEL_CE6_ERROR", "RESTART_APP", "copy engine 6 exception"),
    _x(76, "ROBUST_CHANNEL_CE7_ERROR", "RESTART_APP", "copy engine 7 exception"),
    _x(77, "ROBUST_CHANNEL_CE8_ERROR", "RESTART_APP", "copy engine 8 exception"),
    _x(78, "VGPU_START_ERROR", "UPDATE_SWFW", "vGPU start error"),
    _x(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "GPU has fallen off the bus"),
    _x(
        80,
        "PBDMA_PUSHBUFFER_CRC_MISMATCH",
        "RESTART_APP",
        "push buffer CRC mismatch (corrupted data on the bus or in the stream)",
    ),
    _x(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", "CONTACT_SUPPORT", "vga subsystem error"),
    _x(82, "ROBUST_CHANNEL_NVJPG0_ERROR", "RESTART_APP", "JPEG decoder (NVJPG0) exception"),
    _x(83, "ROBUST_CHANNEL_NVDEC1_ERROR", "RESTART_APP", "video decoder (NVDEC1) exception"),
    _x(84, "ROBUST_CHANNEL_NVDEC2_ERROR", "RESTART_APP", "video decoder (NVDEC2) exception"),
    _x(85, "ROBUST_CHANNEL_CE9_ERROR", "RESTART_APP", "copy engine 9 exception"),
    _x(86, "ROBUST_CHANNEL_OFA0_ERROR", "RESTART_APP", "optical flow accelerator (OFA0) exception"),
    _x(87, "NVTELEMETRY_DRIVER_REPORT", "CONTACT_SUPPORT", "nvtelemetry driver report"),
    _x(88, "ROBUST_CHANNEL_NVDEC3_ERROR", "RESTART_APP", "video decoder (NVDEC3) exception"),
    _x(89, "ROBUST_CHANNEL_NVDEC4_ERROR", "RESTART_APP", "video decoder (NVDEC4) exception"),
    _x(90, "LTC_ERROR", "CONTACT_SUPPORT", "ltc error"),
    _x(91, "RESERVED_XID", "CONTACT_SUPPORT", "reserved xid"),
    _x(92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", "high single-bit ECC error rate"),
    _x(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "IGNORE", "InfoROM erase limit exceeded"),
    _x(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "RESTART_APP",
        "contained ECC error: the application that touched the memory was stopped, others go on",
    ),
    _x(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "RESET_GPU",
        "uncontained ECC error: every application on the GPU is affected",
    ),
    _x(96, "ROBUST_CHANNEL_NVDEC5_ERROR", "RESTART_APP", "video decoder (NVDEC5) exception"),
    _x(97, "ROBUST_CHANNEL_NVDEC6_ERROR", "RESTART_APP", "video decoder (NVDEC6) exception"),
    _x(98, "ROBUST_CHANNEL_NVDEC7_ERROR", "RESTART_APP", "video decoder (NVDEC7) exception"),
    _x(99, "ROBUST_CHANNEL_NVJPG1_ERROR", "RESTART_APP", "JPEG decoder (NVJPG1) exception"),
    _x(100, "ROBUST_CHANNEL_NVJPG2_ERROR", "RESTART_APP", "JPEG decoder (NVJPG2) exception"),
    _x(101, "ROBUST_CHANNEL_NVJPG3_ERROR", "RESTART_APP", "JPEG decoder (NVJPG3) exception"),
    _x(102, "ROBUST_CHANNEL_NVJPG4_ERROR", "RESTART_APP", "JPEG decoder (NVJPG4) exception"),
    _x(103, "ROBUST_CHANNEL_NVJPG5_ERROR", "RESTART_APP", "JPEG decoder (NVJPG5) exception"),
    _x(104, "ROBUST_CHANNEL_NVJPG6_ERROR", "RESTART_APP", "JPEG decoder (NVJPG6) exception"),
    _x(105, "ROBUST_CHANNEL_NVJPG7_ERROR", "RESTART_APP", "JPEG decoder (NVJPG7) exception"),
    _x(106, "SMBPBI_TEST_MESSAGE", "IGNORE", "smbpbi test message"),
    _x(107, "SMBPBI_TEST_MESSAGE_SILENT", "IGNORE", "smbpbi test message silent"),
    _x(108, "DESTINATION_FLA_TRANSLATION_ERROR", "CONTACT_SUPPORT", "destination fla translation error"),
    _x(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU", "context switch timeout"),
    _x(110, "SEC_FAULT_ERROR", "RESET_GPU", "security fault"),
    _x(111, "BUNDLE_ERROR_EVENT", "CONTACT_SUPPORT", "bundle error event"),
    _x(112, "DISP_SUPERVISOR_ERROR", "CONTACT_SUPPORT", "disp supervisor error"),
    _x(113, "DP_LT_FAILURE", "CONTACT_SUPPORT", "dp lt failure"),
    _x(114, "HEAD_RG_UNDERFLOW", "CONTACT_SUPPORT", "head rg underflow"),
    _x(115, "CORE_CHANNEL_REGS", "CONTACT_SUPPORT", "core channel regs"),
    _x(116, "WINDOW_CHANNEL_REGS", "CONTACT_SUPPORT", "window channel regs"),
    _x(117, "CURSOR_CHANNEL_REGS", "CONTACT_SUPPORT", "cursor channel regs"),
    _x(118, "HEAD_REGS", "CONTACT_SUPPORT", "head regs"),
    _x(119, "GSP_RPC_TIMEOUT", "RESET_GPU", "GSP RPC timeout (GPU System Processor did not answer)"),
    _x(120, "GSP_ERROR", "RESET_GPU", "GSP error (GPU System Processor)"),
    _x(121, "C2C_ERROR", "IGNORE", "C2C (chip-to-chip) link error"),
    _x(122, "SPI_PMU_RPC_READ_FAIL", "CONTACT_SUPPORT", "SPI read failure in the power management unit"),
    _x(123, "SPI_PMU_RPC_WRITE_FAIL", "CONTACT_SUPPORT", "SPI write failure in the power management unit"),
    _x(124, "SPI_PMU_RPC_ERASE_FAIL", "CONTACT_SUPPORT", "SPI erase failure in the power management unit"),
    _x(125, "INFOROM_FS_ERROR", "CONTACT_SUPPORT", "InfoROM file system error"),
    _x(126, "ROBUST_CHANNEL_CE10_ERROR", "RESTART_APP", "copy engine 10 exception"),
    _x(127, "ROBUST_CHANNEL_CE11_ERROR", "RESTART_APP", "copy engine 11 exception"),
    _x(128, "ROBUST_CHANNEL_CE12_ERROR", "RESTART_APP", "copy engine 12 exception"),
    _x(129, "ROBUST_CHANNEL_CE13_ERROR", "RESTART_APP", "copy engine 13 exception"),
    _x(130, "ROBUST_CHANNEL_CE14_ERROR", "RESTART_APP", "copy engine 14 exception"),
    _x(131, "ROBUST_CHANNEL_CE15_ERROR", "RESTART_APP", "copy engine 15 exception"),
    _x(132, "ROBUST_CHANNEL_CE16_ERROR", "RESTART_APP", "copy engine 16 exception"),
    _x(133, "ROBUST_CHANNEL_CE17_ERROR", "RESTART_APP", "copy engine 17 exception"),
    _x(134, "ROBUST_CHANNEL_CE18_ERROR", "RESTART_APP", "copy engine 18 exception"),
    _x(135, "ROBUST_CHANNEL_CE19_ERROR", "RESTART_APP", "copy engine 19 exception"),
    _x(136, "ALI_TRAINING_FAIL", "RESET_GPU", "NVLink ALI training failure"),
    _x(137, "NVLINK_FLA_PRIV_ERR", "IGNORE", "NVLink FLA privilege error"),
    _x(138, "ROBUST_CHANNEL_DLA_ERROR", "CONTACT_SUPPORT", "dla error"),
    _x(139, "ROBUST_CHANNEL_OFA1_ERROR", "RESTART_APP", "optical flow accelerator (OFA1) exception"),
    _x(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU", "unrecovered ECC error escaped containment"),
    _x(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "IGNORE", "fast path error"),
    _x(142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT", "video encoder (NVENC3) exception"),
    _x(143, "GPU_INIT_ERROR", "RESET_GPU", "GPU initialization failure"),
    _x(144, "NVLINK_SAW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink SAW error"),
    _x(145, "NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink RLW error"),
    _x(146, "NVLINK_TLW_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink TLW error"),
    _x(147, "NVLINK_TREX_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink TREX error"),
    _x(148, "NVLINK_NVLPW_CTRL_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink NVLPW control error"),
    _x(149, "NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink NETIR error"),
    _x(150, "NVLINK_MSE_ERROR", "WORKFLOW_NVLINK5_ERR", "NVLink MSE error"),
    _x(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", "key rotation error (confidential computing)"),
    _x(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", "IGNORE", "dla smmu error"),
    _x(153, "ROBUST_CHANNEL_DLA_TIMEOUT", "IGNORE", "dla timeout"),
    _x(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "XID_154_EVAL",
        "GPU recovery action changed: follow the action of the XID it names",
    ),
    _x(155, "NVLINK_SW_DEFINED_ERROR", "RESET_GPU", "NVLink software-defined error"),
    _x(156, "RESOURCE_RETIREMENT_EVENT", "RESET_GPU", "resource retirement event"),
    _x(157, "RESOURCE_RETIREMENT_FAILURE", "IGNORE", "resource retirement failure"),
    _x(158, "GPU_FATAL_TIMEOUT", "RESET_GPU", "GPU fatal timeout"),
    _x(
        159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHECK_UVM", "CHI non-data error (check unified memory use)"
    ),
    _x(160, "CHANNEL_RETIREMENT_EVENT", "RESTART_BM", "channel retirement event"),
    _x(161, "CHANNEL_RETIREMENT_FAILURE", "IGNORE", "channel retirement failure"),
    _x(162, "XID_162", "RESET_GPU", "GPU error needing a reset (newest catalogue entry)"),
)

#: Every catalogued XID by code.
CATALOGUE: Mapping[int, XidInfo] = {e.code: e for e in _ENTRIES}


def resolution(code: int) -> XidResolution:
    """The code's class; unknown when the catalogue does not have it."""
    entry = CATALOGUE.get(code)
    return entry.resolution if entry is not None else XidResolution.UNKNOWN


def explain(code: int) -> str:
    """'XID 79 (GPU has fallen off the bus; NVIDIA: reboot-node): drain and reboot the node, ...'."""
    entry = CATALOGUE.get(code)
    if entry is None:
        return f"XID {code} ({ACTIONS[XidResolution.UNKNOWN]})"
    return f"XID {code} ({entry.meaning}; NVIDIA: {entry.resolution}): {entry.action}"


def is_application(code: int) -> bool:
    """An application-level XID (restart the app, or nothing to do): never the GPU's fault alone."""
    return resolution(code) in APPLICATION_CLASSES


class XidChoice:
    """Which XIDs taint under one policy: ignored > critical > the catalogue class."""

    def __init__(self, spec: XidFault) -> None:
        self.ignored = frozenset(spec.ignored)
        self.critical = frozenset(spec.critical)
        self.classes = frozenset(spec.taint_classes)

    def __call__(self, code: int) -> bool:
        if code == 0 or code in self.ignored:
            return False
        return code in self.critical or resolution(code) in self.classes


def xid_advice(kind: str, gpus: Iterable[GpuFault]) -> str:
    """': XID 79 (...; NVIDIA: reboot-node): drain and reboot ...' for an XID fault's codes, else ''."""
    if kind != "xid":
        return ""
    codes = sorted({int(g.fingerprint["xid"]) for g in gpus if "xid" in g.fingerprint})
    return "".join(f"; {explain(code)}" for code in codes)
