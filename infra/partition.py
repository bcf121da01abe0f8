"""Partition-aware ARNs: the same program serves ``aws``, ``aws-eusc``, ``aws-us-gov``, ``aws-cn``.

The partition comes from ``deployment.cloud.partition`` in the config, never from a hard-coded
``arn:aws:`` prefix (AWS European Sovereign Cloud is its own partition with its own IAM).
"""

from __future__ import annotations

from dataclasses import dataclass

#: DNS suffix of AWS service endpoints per partition (used in ``kms:ViaService`` conditions).
DNS_SUFFIX = {
    "aws": "amazonaws.com",
    "aws-us-gov": "amazonaws.com",
    "aws-cn": "amazonaws.com.cn",
    "aws-eusc": "amazonaws.eu",
}


@dataclass(frozen=True)
class Partition:
    """Builds ARNs in one AWS partition.

    Attributes:
        name: Partition name, e.g. ``aws`` or ``aws-eusc``.
    """

    name: str

    def arn(self, service: str, resource: str, *, region: str = "", account: str = "") -> str:
        """``arn:<partition>:<service>:<region>:<account>:<resource>``."""
        return f"arn:{self.name}:{service}:{region}:{account}:{resource}"

    def managed_policy(self, policy_name: str) -> str:
        """ARN of an AWS managed IAM policy, e.g. ``AmazonEKSClusterPolicy``."""
        return self.arn("iam", f"policy/{policy_name}", account="aws")

    def account_root(self, account: str) -> str:
        """ARN of an account's root principal (the KMS key administrator)."""
        return self.arn("iam", "root", account=account)

    def service_endpoint(self, service: str, region: str) -> str:
        """Host name of a regional service endpoint, e.g. ``s3.eu-central-1.amazonaws.com``."""
        return f"{service}.{region}.{DNS_SUFFIX[self.name]}"

    def bucket_objects(self, bucket_arn: str) -> str:
        """ARN pattern of every object in a bucket."""
        return f"{bucket_arn}/*"
