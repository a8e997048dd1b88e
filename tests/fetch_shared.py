"""Fetch the shared real traces (Kineto, Nsight Systems, flight recorder) from their public sources.

CI reads them from ``../shared/traces``; a contributor without that folder runs

    python tests/fetch_shared.py            # downloads into tests/shared/traces (git-ignored)
    python -m pytest -q                     # the tests now find them (tests/testpaths.py)

Every file is pinned: the repository and commit it is a byte-identical copy of, and its size
and SHA-256, which are checked after every download or copy; a file whose hash differs is
discarded and reported, never used. The sources and licences are described in the READMEs next
to the traces (kineto/README.md, nsys/README.md, flightrec/README.md of ../shared/traces).

Five files have no upstream copy to download: the four ``.sqlite`` files of ``nsys/ai-profiler``
and ``nsys/jacobi-mpi`` were exported from the upstream reports with Nsight Systems 2023.4 and
stripped of the converting machine's paths (nsys/README.md), and ``LICENSE.labs-CFD`` is the
lab folder's own licence. They come from ``--from DIR`` (a copy of ../shared/traces) or
``--mirror URL`` (any HTTP(S) base holding the same tree); without them the tests that read
them skip, saying so.

Options: ``--dest DIR`` (default tests/shared/traces), ``--from DIR`` (copy from a local tree
instead of downloading, checking every hash: also how this script's table is checked against
../shared/traces), ``--mirror URL``, ``--check`` (verify what is at --dest, fetch nothing).
Exit status: 0 when every file is present and matches, 1 otherwise (each problem one line).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

DEST = Path(__file__).resolve().parent / "shared" / "traces"

# source key → (GitHub repository, commit)
SOURCES = {
    "ai-profiler": ("openhackathons-org/AI-Profiler", "709cacd4f1292ed7b40fe293c20edc735c60d7d5"),
    "gpubootcamp": ("openhackathons-org/gpubootcamp", "4a9f630945c98d488c277058f276af4d8bc70efe"),
    "hta": ("facebookresearch/HolisticTraceAnalysis", "f4d0062c382f42bd8a74838bcdad1916c7d5d2da"),
    "nsys-ai@15e32362": ("GindaChen/nsys-ai", "15e32362953a1cccc6e17d3145176f92d76f7114"),
    "nsys-ai@ab196ea2": ("GindaChen/nsys-ai", "ab196ea237d90e8df5270293d14cff1a95032500"),
    "nsys-ai@ead4735c": ("GindaChen/nsys-ai", "ead4735c311128e8bf79783a2b2271bb36439dcb"),
    "nvrx": ("NVIDIA/nvidia-resiliency-ext", "d8686d9c7015c39ce91dd01788c0ab111a24818b"),
    "param": ("facebookresearch/param", "1e115ffc62c6d048405d9b963191736c13811b1d"),
    "tracelens": ("AMD-AGI/TraceLens", "171dd74721ca1ec45709e5805b68ae1f65e27811"),
}

# (path under traces/, source key, path in the source repository or None, bytes, sha256)
FILES = [
    (
        "flightrec/LICENSE.nvidia-resiliency-ext",
        "nvrx",
        "LICENSE.txt",
        679,
        "dd033392c6b61d370e3c6ebed914f0ae105f0d81ba4b877859f6a617d0fedad6",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_0",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_0",
        3440,
        "a5b35a31c6365c4b776339a87dcb412cabeed1583e11d47a6a147b8833beb294",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_1",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_1",
        3446,
        "4460b88ec624235280cbe8d8ae141446cf5e80bdb7f5575298bd961cf97ec1e6",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_10",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_10",
        5267,
        "6fd18af1adb9852aac19d8f1f86f46626050fb1817503bd760c4824eacbead96",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_11",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_11",
        5267,
        "7602bf3f0333a2beb422dbfc0d76c266cf5e3f5d06befbc132d449f504039874",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_12",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_12",
        5270,
        "fc91fae9650c2e12ce3901f8446e3feaa0bffdd1d298e4c9beb3aa63d29129e4",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_13",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_13",
        5270,
        "0572f87e616ae8958c77654a7febe190d1ff8a167bac193db74b3f648fe317b1",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_14",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_14",
        4663,
        "ef664ef5d22676633e091750eef91b449bbb6fe6840d3746345f5cf4057ab38c",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_15",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_15",
        5271,
        "9101983f989fea8310f583ba61476528b95ce3c576b855f5728668e5a6ee7d4b",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_2",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_2",
        3448,
        "9ca2069370192f164842762d3fe42416441b1eb73bf2a39fcf38cebd0d125bff",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_3",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_3",
        3442,
        "77cb22ae2684db4bd70965623e7ad0be9f9a1f0b0e6486f966d103171bc97e7f",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_4",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_4",
        3444,
        "cfca9ab322ff7f88d288ae75fb618c614f794fbb6e38f1295106c4051c6e9487",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_5",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_5",
        3450,
        "3e66c40e272d7412d9aaf484617893d4e2afd1d2458a11fc2caac4bab415b030",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_6",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_6",
        3450,
        "a7894ee2b23a3ccc91d7d104fe130aa05c9b879821b3366b902de75143cc22c8",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_7",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_7",
        3444,
        "d8853276dfb7923abbbe779d35dd19bfea195d6539f72784593bf93ba81a6c12",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_8",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_8",
        5263,
        "ee081615515ad588bf061a5f698e7e3025d7ac6e2b3c1f9002806a6fed55d3bd",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/_dump_9",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/_dump_9",
        4655,
        "a630a404a8c816b8c84def7930a32db2e3b1e3a09b313555861dbc60d72e1397",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/fault_injection.log",
        "nvrx",
        "tests/attribution/unit/fr_traces/gpu_error_2nd/fault_injection.log",
        101,
        "d9a2c02df3e18480ee41e9e8817cc7c9c0372855d562c2ab3ca929a7fd9ea95e",
    ),
    (
        "flightrec/nvrx_gpu_error_2nd/reference_output.txt",
        "nvrx",
        "tests/attribution/unit/reference_outputs/gpu_error_2nd_reference.txt",
        233,
        "f72185be971982a3282c130c32048254aaade7ca1db36a51237544c2762ea657",
    ),
    (
        "kineto/LICENSE.HolisticTraceAnalysis",
        "hta",
        "LICENSE",
        1088,
        "da6d3703ed11cbe42bd212c725957c98da23cbff1998c05fa4b3d976d1a58e93",
    ),
    (
        "kineto/LICENSE.TraceLens",
        "tracelens",
        "LICENSE",
        1147,
        "bb39639259474d490f93401ed0cec55f072f4f77d80a6ad52aaabe37663cf07e",
    ),
    (
        "kineto/LICENSE.param",
        "param",
        "LICENSE",
        1086,
        "52412d7bc7ce4157ea628bbaacb8829e0a9cb3c58f57f99176126bc8cf2bfc85",
    ),
    (
        "kineto/a100x2_r0_pgcfg/rank-0.json.gz",
        "hta",
        "tests/data/nccl_parser_config/nccl_data.json.gz",
        749757,
        "c1cf9c575fdcd7bdc6326ceab834f94b351f81ae55577a7471aa9e328fb8b58e",
    ),
    (
        "kineto/a100x8_r3/rank-3.json.gz",
        "hta",
        "tests/data/trace_diff/control/control.json.gz",
        1771264,
        "43ed872e4c5dc2e8da5946d761ed61923a75c6c799cc62be9e1c859d440a56fd",
    ),
    (
        "kineto/b200x8_r0_infer/rank-0.json.gz",
        "tracelens",
        "tests/traces/b200/eager_trace.json.gz",
        816469,
        "7f5e9c9dc4ba71371fde1d947204134575b05d7a614986f249fa8142663c7ca2",
    ),
    (
        "kineto/edge_amd_mi250/mi250.json.gz",
        "hta",
        "tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        6785,
        "39fdab670f9e80a05ccc6d0d07611b3aeba1092fa10681d8dd08cea48d0488b5",
    ),
    (
        "kineto/edge_cpu_only/rank-34.json.gz",
        "hta",
        "tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        2464,
        "b2ff87b29bd604b0c30bca65915af4388b53a7f421f0897c68a7862e1559b6e5",
    ),
    (
        "kineto/edge_distinfo_no_rank/a100.json.gz",
        "hta",
        "tests/data/rank_unavailable/rank_not_found.json.gz",
        46130,
        "5d7c951ffc8455aceef0deaa2378cc5718d247173abcaec9f45af6d0826864b5",
    ),
    (
        "kineto/edge_h100_infer_1step/h100.json.gz",
        "tracelens",
        "tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
        71459,
        "309220b5130afa8bc5151252fb1fc3fc9fe6cdc099a07854c0c157e03abb4233",
    ),
    (
        "kineto/edge_h100_infer_1step/tracelens_gpu_timeline.csv",
        "tracelens",
        "tests/traces/h100/gaunernst_bert-small-uncased__1016001_perf_report_csvs/gpu_timeline.csv",
        364,
        "383734cd684b1ae8b89a12e15a000b2c6ba211f108b85329069da35ab242d470",
    ),
    (
        "kineto/edge_mi210_gpu_only/mi210.json.gz",
        "tracelens",
        "tests/traces/mi210/gpu_only_trace/gpu_only_trace.json.gz",
        36173,
        "0c9c627bcefe7365e6595ff9f86594e07553820db6a268c09c369e25fe47b97a",
    ),
    (
        "kineto/edge_mi210_gpu_only/tracelens_gpu_timeline.csv",
        "tracelens",
        "tests/traces/mi210/gpu_only_trace/gpu_only_trace_perf_report_csvs/gpu_timeline.csv",
        293,
        "ee7da29e431725d5c476c11eff408e5ff1a7d2f39cc18bd6a1b73521b15f7edb",
    ),
    (
        "kineto/edge_mi300x_infer_1step/mi300x.json.gz",
        "tracelens",
        "tests/traces/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
        74921,
        "32f123ef8a3d14c8352b43bd540fe42b4a9e07225700af5e261e29b4de9e6f8c",
    ),
    (
        "kineto/edge_mi300x_infer_1step/tracelens_gpu_timeline.csv",
        "tracelens",
        "tests/traces/mi300/gaunernst_bert-small-uncased__1016001_perf_report_csvs/gpu_timeline.csv",
        359,
        "21868aa0b884eded3ecd2cb65b49efe57c4de71843895b45a226c14959be3744",
    ),
    (
        "kineto/edge_mi300x_triton_tiny/mi300x.json.gz",
        "tracelens",
        "tests/traces/torch_compile_triton/trace.json.gz",
        5979,
        "fe026809aa6cb13e3dcec85bca3c3a955da52284de49178675499b452874190e",
    ),
    (
        "kineto/edge_no_distinfo/a100.json.gz",
        "hta",
        "tests/data/distributed_info_unavailable/distributed_info_not_found.json.gz",
        46385,
        "2294b134930afc9253c9cc80c31ff7b40709f4114b51a37301dc7a19046bf7d2",
    ),
    (
        "kineto/mi300x_ddp8_r0_rccl/rank-0.json.gz",
        "tracelens",
        "tests/traces/mi300/resnet_act_checkpoint.json.gz",
        1160542,
        "0a6a7dfe1f0bf16c74876ebabffbac57b350d8897c4ad42c3dcf6d1dab2aa2aa",
    ),
    (
        "kineto/mi300x_ddp8_r0_rccl/tracelens_coll_analysis.csv",
        "tracelens",
        "tests/traces/mi300/resnet_act_checkpoint_recompute_perf_report_csvs/coll_analysis.csv",
        941,
        "bb412bb3222d87500ab3270414465712648ded9b343f890fb822cfbc533a1038",
    ),
    (
        "kineto/mi300x_ddp8_r0_rccl/tracelens_gpu_timeline.csv",
        "tracelens",
        "tests/traces/mi300/resnet_act_checkpoint_recompute_perf_report_csvs/gpu_timeline.csv",
        794,
        "39e298684bbc89e9a2715bf084f424712fe15299df071cc1f5ec55c87e17863a",
    ),
    (
        "kineto/rtx2080ti_dataloader_nostep/resnet.json.gz",
        "param",
        "et_replay/tests/inputs/resnet_kineto.json.gz",
        1614921,
        "9467d74ddb0cd577859b294cfe4cf742e476e940d29d99dc0e25eed104088276",
    ),
    (
        "kineto/sampled_2rank_a2a/rank-0.json.gz",
        "hta",
        "tests/data/trace_filter/sampled_rank-0.json.gz",
        124247,
        "71b98c30a2751cc56d9bf78f8fb76467acd56e0be6a1f0da23c600941d29aafd",
    ),
    (
        "kineto/sampled_2rank_a2a/rank-1.json.gz",
        "hta",
        "tests/data/trace_filter/sampled_rank-1.json.gz",
        119799,
        "2f9a65fd5f319ec8e60468a22dc9a624eb4b40369c729f6f897259d587eca57e",
    ),
    (
        "kineto/v100x2_r1/rank-1.json.gz",
        "hta",
        "tests/data/trace_diff/test/test.json.gz",
        1568914,
        "5e69e04ed19b2dbf59e632008146c1bd6da417dc3af7ab4885c619b11e34f1bf",
    ),
    (
        "nsys/ai-profiler/LICENSE",
        "ai-profiler",
        "LICENSE",
        27066,
        "d399cc4cf2446245fbfc3cfdc200f35ed0882e9a73a1f09b3c79bfdd6bfb4e68",
    ),
    (
        "nsys/ai-profiler/baseline.nsys-rep",
        "ai-profiler",
        "workspace/reports/baseline.nsys-rep",
        886159,
        "a76cca338cd6bf9638c9d201b2f826714e0e2f417e8e876b9f069290deec894a",
    ),
    (
        "nsys/ai-profiler/baseline.sqlite",
        "ai-profiler",
        None,
        3035136,
        "f274a80d319e9bedcc549bbc0cfb3e51237e96267ba6da30fa7b394bd17a5df4",
    ),
    (
        "nsys/ai-profiler/baseline_nvtx.sqlite",
        "ai-profiler",
        None,
        13266944,
        "7732db9b8397ae201e9f2c0b57d81a2e671aad3369c23dddb16f0bf202f83f75",
    ),
    (
        "nsys/jacobi-mpi/LICENSE",
        "gpubootcamp",
        "LICENSE",
        27066,
        "d399cc4cf2446245fbfc3cfdc200f35ed0882e9a73a1f09b3c79bfdd6bfb4e68",
    ),
    (
        "nsys/jacobi-mpi/LICENSE.labs-CFD",
        "gpubootcamp",
        None,
        1355,
        "74c4cb269c969389bb199093c6da083c9b69250733722b8d72a21253920511b2",
    ),
    (
        "nsys/jacobi-mpi/report1.qdrep",
        "gpubootcamp",
        "hpc/multi_gpu_nways/labs/CFD/English/C/source_code/mpi/reports/report1.qdrep",
        1634240,
        "16adc94bf659f6e48d60aeef85a1d36f3be02ee1e7dc6092d6732539506e898e",
    ),
    (
        "nsys/jacobi-mpi/report1.sqlite",
        "gpubootcamp",
        None,
        15814656,
        "1078b6e9320407e919617e85041918104edf9073955c6483a0dc02a1639eca3f",
    ),
    (
        "nsys/jacobi-mpi/report2.qdrep",
        "gpubootcamp",
        "hpc/multi_gpu_nways/labs/CFD/English/C/source_code/mpi/reports/report2.qdrep",
        1731523,
        "92e2d10c6505a13422af7effe00e4065789d3924f1a260e57df6d02d6e7be8c0",
    ),
    (
        "nsys/jacobi-mpi/report2.sqlite",
        "gpubootcamp",
        None,
        16736256,
        "e968f4ace4471e1f007c28ceaf2bc4354debad80907ddc8a002849eaa3090497",
    ),
    (
        "nsys/nsys-ai/LICENSE",
        "nsys-ai@ab196ea2",
        "LICENSE",
        1066,
        "560a92213dcf553ce16bd6440829b8b6276e8fb55a26beca55689a0d55a62535",
    ),
    (
        "nsys/nsys-ai/h100_2gpu_1s.sqlite",
        "nsys-ai@ead4735c",
        "tests/fixtures/h100_2gpu_1s.sqlite",
        3878912,
        "386c1cd279540aca6fdf0783e06acc63c24c0cb8c73db163f494c26e7fb5eb44",
    ),
    (
        "nsys/nsys-ai/healthy_1pct.sqlite",
        "nsys-ai@ead4735c",
        "tests/fixtures/healthy_1pct.sqlite",
        114688,
        "7add0e5c998d8d05c2836c201812cb61290bc740fdafea321bae44e2d7cf8dd9",
    ),
    (
        "nsys/nsys-ai/mfu_2gpu_after.sqlite",
        "nsys-ai@ab196ea2",
        "tests/fixtures/mfu_2gpu_after.sqlite",
        2437120,
        "5842c1f3936916df08a503e1917f50c5847c67feabf50a90e6b71139a97b95b8",
    ),
    (
        "nsys/nsys-ai/mfu_2gpu_before.sqlite",
        "nsys-ai@ab196ea2",
        "tests/fixtures/mfu_2gpu_before.sqlite",
        2686976,
        "6ee860b228433993c371a5ccdd7c807ce5b01f2eb8639d84b6692cb632a0dc45",
    ),
    (
        "nsys/nsys-ai/mock.sqlite",
        "nsys-ai@15e32362",
        "tests/fixtures/mock.sqlite",
        339968,
        "73bc2a39ca93358016ac408c75205e29bfa4670b6f5c96f95fde3a5d464a6c9f",
    ),
]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _matches(path: Path, size: int, sha: str) -> bool:
    return path.is_file() and path.stat().st_size == size and _sha256(path) == sha


def _urls(key: str, source_path: str | None, rel: str, mirror: str | None) -> list[str]:
    out = [f"{mirror.rstrip('/')}/{rel}"] if mirror else []
    if source_path is not None:
        repo, commit = SOURCES[key]
        out.append(f"https://raw.githubusercontent.com/{repo}/{commit}/{source_path}")
        # a file kept in Git LFS: raw.githubusercontent.com serves its pointer, this its bytes
        out.append(f"https://media.githubusercontent.com/media/{repo}/{commit}/{source_path}")
    return out


def _download(url: str, to: Path) -> str | None:
    """None on success, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=120) as r, to.open("wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:  # URLError, HTTPError and socket errors are all OSErrors
        return f"{url}: {e}"
    return None


def fetch(dest: Path, source_dir: Path | None, mirror: str | None, check_only: bool) -> list[str]:
    """Fetch (or copy, or only check) every file; the problems, one line each."""
    problems = []
    for rel, key, source_path, size, sha in FILES:
        target = dest / rel
        if _matches(target, size, sha):
            continue
        if check_only:
            problems.append(f"{target}: {'missing' if not target.exists() else 'hash differs'}")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            part = Path(tmp) / target.name
            if source_dir is not None:
                src = source_dir / rel
                if not src.is_file():
                    problems.append(f"{src}: missing in --from")
                    continue
                shutil.copyfile(src, part)
                tried = [str(src)]
            else:
                tried = []
                for url in _urls(key, source_path, rel, mirror):
                    err = _download(url, part)
                    tried.append(err or url)
                    if err is None and _matches(part, size, sha):
                        break
                if not tried:
                    problems.append(
                        f"{rel}: no public source (derived file; see the docstring): "
                        "use --from DIR or --mirror URL"
                    )
                    continue
            if not _matches(part, size, sha):
                problems.append(f"{rel}: size or SHA-256 differs from the pinned copy ({tried})")
                continue
            part.replace(target)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=DEST)
    ap.add_argument("--from", dest="source_dir", type=Path, default=None)
    ap.add_argument("--mirror", default=None)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    problems = fetch(args.dest, args.source_dir, args.mirror, args.check)
    for p in problems:
        print(f"fetch_shared: {p}", file=sys.stderr)
    ok = len(FILES) - len(problems)
    print(f"fetch_shared: {ok} of {len(FILES)} files present and verified in {args.dest}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
