"""Build Lensemble's container image without a container registry.

The deployment stack, beside :mod:`lensemble.stack` (``docs/architecture.md``): imports only
:mod:`lensemble.errors` and the standard library, never torch or grpc.

- :mod:`lensemble.image.debian_base`: a Debian base image from an apt mirror (``mmdebstrap``
  piped into ``docker import``), for sites that can reach no registry.
- :mod:`lensemble.image.client`: the ``docker`` client that can drive BuildKit.
- :mod:`lensemble.image.build`: the one Dockerfile built from a staged, minimal context, with a
  wheelhouse and an extra CA bundle that never reach a layer of the final image.
"""

from __future__ import annotations

from lensemble.errors import EXIT_RUN_FAILED, LensembleError


class ImageBuildFailed(LensembleError):
    """Building the base or the image failed.

    Args:
        message: One sentence naming the step that failed and why.
        remediation: One sentence saying what to do next.
    """

    code = "image_build_failed"
    exit_code = EXIT_RUN_FAILED


#: Repository of the images ``lensemble image build`` tags (``lensemble:<version>-<line>``).
IMAGE_REPOSITORY = "lensemble"

#: Label holding the digest of the build context an image was built from (see
#: :func:`lensemble.image.build.context_digest`): tests and ``lensemble up`` use it to tell a
#: stale image from a current one.
CONTEXT_DIGEST_LABEL = "dev.lensemble.context-digest"


def image_tag(version: str, torch_cuda: str = "cpu") -> str:
    """The image tag of one version and CUDA line, e.g. ``lensemble:0.1.0-cpu``."""
    return f"{IMAGE_REPOSITORY}:{version}-{torch_cuda}"


__all__ = ["CONTEXT_DIGEST_LABEL", "IMAGE_REPOSITORY", "ImageBuildFailed", "image_tag"]
