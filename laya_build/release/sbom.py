"""A release's software bill of materials: ``sbom.cdx.json``, CycloneDX 1.6 (OWASP's
``cyclonedx-python-lib``), of the toolchain environment that built it.

Components: every Python distribution of the build's environment (a library with its package
URL), and the compilers, TVM and the CUDA runtime as applications with the version line the
manifest records.  The document is a function of the environment and the release's time: its
serial number is derived from its content, component references are package URLs.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime

SBOM_NAMESPACE = uuid.UUID("8f0c2f4e-5b1e-4f59-9d1a-3c0d2a6e7b10")  # serial numbers of laya-build SBOMs


def purl(name: str, version: str) -> str:
    """The package URL of a Python distribution (``pkg:pypi/torch@2.13.0%2Bcpu``)."""
    from packageurl import PackageURL

    return PackageURL(type="pypi", name=name, version=version).to_string()


def document(distributions: list[tuple[str, str]], tools: dict[str, str | None], *, version: str, created: str) -> str:
    """The SBOM as JSON text; ``tools``: name -> version line (``None``: not found)."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    bom = Bom()
    bom.metadata.timestamp = datetime.fromisoformat(created)
    bom.metadata.component = Component(name="laya-decision-release", version=version, type=ComponentType.APPLICATION)
    for name, dist_version in distributions:
        ref = purl(name, dist_version)
        bom.components.add(
            Component(
                name=name,
                version=dist_version,
                type=ComponentType.LIBRARY,
                purl=PackageURL.from_string(ref),
                bom_ref=ref,
            )
        )
    for name, line in sorted(tools.items()):
        if line:
            tool = Component(name=name, version=line, type=ComponentType.APPLICATION, bom_ref=f"tool:{name}")
            bom.components.add(tool)
    bom.register_dependency(bom.metadata.component, list(bom.components))
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    data = json.loads(text)
    data.pop("serialNumber", None)
    data["serialNumber"] = uuid.uuid5(SBOM_NAMESPACE, json.dumps(data, sort_keys=True)).urn
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
