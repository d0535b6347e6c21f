"""The program inside a grader sandbox (trainer/graders/pool.py starts it; it imports nothing of the
project, only the standard library and the grader environment's packages).

It speaks newline-delimited JSON over its stdin and the stdout it had at start:
1. setup: {"python": {name: source}, "similarity": [metric, ...], "output_bytes": n}. Each source is
   compiled and run once into its own namespace and must define grade(sample, item) callable with two
   arguments; the libraries of the text-similarity metrics named are imported. Reply {"ready": true}, or {"setup_error": {...}}.
2. then batches of samples: {"id": n, "samples": [[task, ...], ...]}, a task being {"kind": "python",
   "name", "sample", "item"} or {"kind": "similarity", "metric", "input", "reference"}. One reply line per
   sample, as soon as it is graded: {"id": n, "index": i, "results": [...], "output": "...", "seconds"}:
   per task {"score": x} or {"error": kind, "message", "traceback"}, kind one of exception,
   not_a_number, non_finite; `output` the first output_bytes of what the sample's code wrote. The parent
   times each sample from the reply before it, so every sample has its own budget.

The tenant's code never sees the protocol's pipes as its stdin/stdout: fd 0 reads /dev/null and fds 1
and 2 write to a scratch file, read back (and emptied) after each sample. Builtins are restored after
every call, so a grader that patches them changes nothing of the calls after it. Nothing here is a
security boundary: the sandbox around this process is (the parent trusts no reply it did not ask for,
and checks every score it gets).
"""

import builtins
import json
import linecache
import math
import numbers
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO

OUTPUT_FILE = "/work/.grader-output"
WORDNET = "/grader/wordnet"  # WordNet 3.0's database files and lexnames, bound read-only when present
TRACEBACK_CHARS = 4000
MESSAGE_CHARS = 1000
_dumps, _loads, _isfinite, _float = json.dumps, json.loads, math.isfinite, float
_BUILTINS = builtins.__dict__


def _channels() -> tuple[BinaryIO, BinaryIO]:
    """(protocol in, protocol out); fds 0, 1 and 2 handed over to the grader's code."""
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    capture = os.open(OUTPUT_FILE, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(capture, 1)
    os.dup2(capture, 2)
    os.close(capture)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    return proto_in, proto_out


def _taken_output(limit: int) -> str:
    """The first `limit` bytes written to fds 1 and 2 since the last call; the file emptied."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fstat(1).st_size == 0 and os.fstat(2).st_size == 0:
            return ""  # nothing written (the usual case): no file to read
        with open(OUTPUT_FILE, "rb") as written:
            data = written.read(limit + 1)
        os.truncate(OUTPUT_FILE, 0)
        os.lseek(1, 0, os.SEEK_SET)
        os.lseek(2, 0, os.SEEK_SET)
    except Exception:  # the grader's code moved or removed the file: no output to report
        return ""
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[output truncated]" if len(data) > limit else "")


def _failure(kind: str, err: BaseException, skip: int = 0) -> dict[str, Any]:
    """The error as the protocol reports it; `skip` leading frames (the harness's own) left out."""
    trace = err.__traceback__
    for _ in range(skip):
        trace = trace.tb_next if trace is not None and trace.tb_next is not None else trace
    text = "".join(traceback.format_exception(type(err), err, trace))
    return {
        "error": kind,
        "message": f"{type(err).__name__}: {err}"[:MESSAGE_CHARS],
        "traceback": text[-TRACEBACK_CHARS:],
    }


def _checked(value: object) -> dict[str, Any]:
    """{"score": x} for a real number other than a bool, else the error it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return {"error": "not_a_number", "message": f"grade returned {type(value).__name__}, not a number"}
    number = _float(value)
    if not _isfinite(number):
        return {"error": "non_finite", "message": f"grade returned {number}"}
    return {"score": number}


def _load(name: str, source: str) -> Callable[..., object]:
    namespace = {"__name__": "grader", "__builtins__": builtins}
    filename = f"<grader {name or 'python'}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for tracebacks
    exec(compile(source, filename, "exec"), namespace)  # the sandbox runs it
    grade = namespace.get("grade")
    if not callable(grade):
        raise TypeError("the source defines no function grade(sample, item)")
    import inspect

    try:
        inspect.signature(grade).bind(None, None)
    except TypeError:
        raise TypeError("grade must take two arguments: grade(sample, item)") from None
    except ValueError:
        pass  # a callable without a signature (a builtin): it is called and judged then
    return grade


def _wordnet() -> Any:
    """nltk's WordNet reader over the database files the sandbox binds (Debian's wordnet-base)."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class WordNet30(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet") -> None:
            return None  # nltk maps its own "wordnet" corpus onto this one; this one is WordNet 3.0 itself

    nltk.data.path.append(WORDNET)  # nltk reads corpora only under its data paths
    return WordNet30(WORDNET, None)


class Similarity:
    """The text_similarity metrics, each from its library (docs/GRADERS.md); a library is imported only
    for the metrics the grader uses."""

    def __init__(self, metrics: list[str]) -> None:
        self.scorers = {}
        for metric in metrics:
            self.scorers[metric] = self._scorer(metric)

    def _scorer(self, metric: str) -> Callable[[str, str], float]:
        if metric == "fuzzy_match":
            from rapidfuzz import fuzz, utils

            return lambda hyp, ref: fuzz.WRatio(hyp, ref, processor=utils.default_process) / 100.0
        if metric == "bleu":
            from sacrebleu.metrics import BLEU

            bleu = BLEU(effective_order=True)
            return lambda hyp, ref: bleu.sentence_score(hyp, [ref]).score / 100.0
        if metric == "gleu":
            from nltk.translate import gleu_score

            return lambda hyp, ref: gleu_score.sentence_gleu([ref.split()], hyp.split())
        if metric == "meteor":
            from nltk.translate import meteor_score

            if not os.path.isdir(WORDNET):
                raise RuntimeError("meteor needs WordNet, which this grader environment lacks")
            wordnet = _wordnet()
            return lambda hyp, ref: meteor_score.meteor_score([ref.split()], hyp.split(), wordnet=wordnet)
        if metric.startswith("rouge_"):
            from rouge_score import rouge_scorer

            key = "rougeL" if metric == "rouge_l" else "rouge" + metric[len("rouge_") :]
            scorer = rouge_scorer.RougeScorer([key])
            return lambda hyp, ref: scorer.score(ref, hyp)[key].fmeasure
        raise ValueError(f"unknown metric {metric!r}")

    def score(self, metric: str, hypothesis: str, reference: str) -> float:
        return self.scorers[metric](hypothesis, reference)


def _setup(message: dict[str, Any]) -> tuple[Any, Any, dict[str, Any] | None]:
    graders = {}
    for name, source in message.get("python", {}).items():
        try:
            graders[name] = _load(name, source)
        except BaseException as err:  # SystemExit and KeyboardInterrupt raised by the source too
            return None, None, {"name": name, **_failure("exception", err)}
    similarity = None
    if message.get("similarity"):
        try:
            similarity = Similarity(message["similarity"])
        except BaseException as err:
            return None, None, {"name": "", **_failure("exception", err)}
    return graders, similarity, None


def _run_task(
    task: dict[str, Any], graders: dict[str, Any], similarity: Any, saved: dict[str, Any]
) -> dict[str, Any]:
    """One task's result. Builtins are put back as they were before the value is even looked at, so a
    grader that patched them (isinstance, float) changes neither this check nor any later call."""
    try:
        if task["kind"] == "python":
            value = graders[task["name"]](task["sample"], task["item"])
        else:
            value = similarity.score(task["metric"], task["input"], task["reference"])
    except BaseException as err:  # whatever the grader raised, SystemExit included, is its error
        _restore(saved)
        return _failure("exception", err, skip=1)
    _restore(saved)
    try:
        return _checked(value)
    except BaseException as err:  # a value whose __float__ raises
        return _failure("exception", err)


def _restore(saved: dict[str, Any]) -> None:
    _BUILTINS.clear()  # module globals and dict methods only: a grader may have deleted every builtin
    _BUILTINS.update(saved)


def main() -> None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[name] = "1"
    sys.path.append("/grader/site-packages")
    proto_in, proto_out = _channels()
    setup = _loads(proto_in.readline())
    limit = int(setup.get("output_bytes", 4096))
    graders, similarity, problem = _setup(setup)
    output = _taken_output(limit)
    if problem is not None:
        proto_out.write(_dumps({"setup_error": problem, "output": output}).encode() + b"\n")
        return
    proto_out.write(b'{"ready": true}\n')
    saved = dict(_BUILTINS)
    while True:
        line = proto_in.readline()
        if not line:
            return
        request = _loads(line)
        for index, tasks in enumerate(request["samples"]):
            start = time.perf_counter()
            results = [_run_task(task, graders, similarity, saved) for task in tasks]
            if os.getpid() != 1:  # a copy the grader forked got here: only the sandbox's init speaks
                os._exit(0)
            reply = {
                "id": request["id"],
                "index": index,
                "results": results,
                "output": _taken_output(limit),
                "seconds": time.perf_counter() - start,
            }
            proto_out.write(_dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    main()
