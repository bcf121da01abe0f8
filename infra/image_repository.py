"""``ImageRepository``: the ECR repository of the one Lensemble image."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

#: Release images are tagged ``sha-<7 hex>`` (immutable, one per commit); keep this many.
KEEP_SHA_IMAGES = 200
#: Untagged layers left by interrupted pushes are removed after this many days.
UNTAGGED_EXPIRY_DAYS = 14


@dataclass(frozen=True)
class ImageRepositoryArgs:
    """Inputs of an :class:`ImageRepository`.

    Attributes:
        provider: AWS provider of the repository's region.
        repository_name: ECR repository name, e.g. ``lensemble``.
        tags: Tags on every resource.
    """

    provider: aws.Provider
    repository_name: str
    tags: dict[str, str] | None = None


def lifecycle_policy() -> str:
    """ECR lifecycle policy: keep the newest ``sha-*`` images, expire untagged ones.

    ECR applies the rule of lowest priority number first and an image matched by one rule is not
    considered by later ones, so version tags (``0.1.0-cpu``) are never expired.

    Returns:
        The policy document (JSON).
    """
    return json.dumps(
        {
            "rules": [
                {
                    "rulePriority": 1,
                    "description": f"Keep the newest {KEEP_SHA_IMAGES} sha-* images",
                    "selection": {
                        "tagStatus": "tagged",
                        "tagPatternList": ["sha-*"],
                        "countType": "imageCountMoreThan",
                        "countNumber": KEEP_SHA_IMAGES,
                    },
                    "action": {"type": "expire"},
                },
                {
                    "rulePriority": 2,
                    "description": f"Expire untagged images after {UNTAGGED_EXPIRY_DAYS} days",
                    "selection": {
                        "tagStatus": "untagged",
                        "countType": "sinceImagePushed",
                        "countUnit": "days",
                        "countNumber": UNTAGGED_EXPIRY_DAYS,
                    },
                    "action": {"type": "expire"},
                },
            ]
        }
    )


class ImageRepository(pulumi.ComponentResource):
    """ECR repository: immutable tags, scan on push, KMS encryption, lifecycle on ``sha-*``.

    Outputs: ``repository_url``, ``arn``.
    """

    def __init__(
        self, name: str, args: ImageRepositoryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:aws:ImageRepository", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        repository = aws.ecr.Repository(
            f"{name}-ecr",
            name=args.repository_name,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(
                scan_on_push=True
            ),
            encryption_configurations=[
                aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS")
            ],
            tags=args.tags,
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-lifecycle", repository=repository.name, policy=lifecycle_policy(), opts=child
        )
        self.repository_url = repository.repository_url
        self.arn = repository.arn
        self.register_outputs({"repository_url": self.repository_url, "arn": self.arn})
