"""``Network``: a VPC whose nodes reach AWS APIs through VPC endpoints, not the internet."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

#: Interface endpoints nodes need in a private cluster: image pulls (ecr.api, ecr.dkr),
#: credentials (sts; eks-auth serves EKS Pod Identity), logs, ec2 for the node bootstrap, and kms
#: (the coordinator MACs its run record with a KMS key; sovereign-prod has no other route out).
#: S3 is a gateway endpoint (image layers and participant buckets).
INTERFACE_ENDPOINTS = ("ecr.api", "ecr.dkr", "sts", "logs", "ec2", "eks-auth", "kms")
HTTPS = 443


@dataclass(frozen=True)
class NetworkArgs:
    """Inputs of a :class:`Network`.

    Attributes:
        provider: AWS provider pinned to the network's region.
        cidr: IPv4 CIDR of the VPC; each subnet is a slice four bits longer (a /16 gives
            /20 subnets).
        availability_zones: Private subnets, one per availability zone (count).
        public_subnets: Also create public subnets with an internet gateway, for internet-facing
            load balancers and the NAT gateway. No node runs in them.
        nat_egress: Route the private subnets to the internet through one NAT gateway (staging
            pulls public images; a participant dials a coordinator in another account). Needs
            ``public_subnets``.
        tags: Tags on every resource (on top of the provider's default tags).
    """

    provider: aws.Provider
    cidr: str
    availability_zones: int
    public_subnets: bool = False
    nat_egress: bool = False
    tags: dict[str, str] | None = None


class Network(pulumi.ComponentResource):
    """VPC, private subnets, VPC endpoints (S3, ECR api+dkr, STS, logs, EC2, EKS auth).

    Outputs: ``vpc_id``, ``private_subnet_ids``, ``public_subnet_ids``, ``nat_public_ip`` (the
    address a participant gives the consortium for the coordinator's allow-list).

    Raises:
        ValueError: ``nat_egress`` without ``public_subnets``, or a CIDR too small for the
            subnets.
    """

    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]
    nat_public_ip: pulumi.Output[str] | None

    def __init__(
        self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("lensemble:aws:Network", name, None, opts)
        if args.nat_egress and not args.public_subnets:
            raise ValueError("a NAT gateway needs public subnets; set public_subnets too")
        network = ipaddress.ip_network(args.cidr)
        self._slices = list(network.subnets(new_prefix=min(network.prefixlen + 4, 28)))
        needed = args.availability_zones * (2 if args.public_subnets else 1)
        if len(self._slices) < needed:
            raise ValueError(f"{args.cidr} is too small for {needed} subnets")
        self._resource_name = name
        self._args = args
        self._child = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self._invoke = pulumi.InvokeOutputOptions(parent=self, provider=args.provider)
        self._tags = dict(args.tags or {})

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={**self._tags, "Name": name},
            opts=self._child,
        )
        self._zones = aws.get_availability_zones_output(state="available", opts=self._invoke)
        private_table = aws.ec2.RouteTable(
            f"{name}-private",
            vpc_id=vpc.id,
            tags={**self._tags, "Name": f"{name}-private"},
            opts=self._child,
        )
        self.private_subnet_ids = self._subnets(vpc, private_table, "private", 0)
        self.public_subnet_ids = []
        self.nat_public_ip = None
        if args.public_subnets:
            self._public_side(vpc, private_table)
        self._endpoints(vpc, private_table)
        self.vpc_id = vpc.id
        self.cidr = args.cidr
        self.register_outputs(
            {
                "vpc_id": vpc.id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
                "nat_public_ip": self.nat_public_ip,
            }
        )

    def _subnets(
        self, vpc: aws.ec2.Vpc, table: aws.ec2.RouteTable, kind: str, first_slice: int
    ) -> list[pulumi.Output[str]]:
        """One ``kind`` (private or public) subnet per availability zone, routed by ``table``."""
        name, tags = self._resource_name, self._tags
        role = "kubernetes.io/role/internal-elb" if kind == "private" else "kubernetes.io/role/elb"
        ids = []
        for i in range(self._args.availability_zones):
            subnet = aws.ec2.Subnet(
                f"{name}-{kind}-{i}",
                vpc_id=vpc.id,
                cidr_block=str(self._slices[first_slice + i]),
                availability_zone=self._zones.names[i],
                map_public_ip_on_launch=False,
                tags={**tags, "Name": f"{name}-{kind}-{i}", role: "1"},
                opts=self._child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-{kind}-{i}",
                subnet_id=subnet.id,
                route_table_id=table.id,
                opts=self._child,
            )
            ids.append(subnet.id)
        return ids

    def _public_side(self, vpc: aws.ec2.Vpc, private_table: aws.ec2.RouteTable) -> None:
        """Public subnets behind an internet gateway and, with ``nat_egress``, a NAT gateway."""
        name, tags, child = self._resource_name, self._tags, self._child
        gateway = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags={**tags, "Name": name}, opts=child
        )
        public_table = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            tags={**tags, "Name": f"{name}-public"},
            opts=child,
        )
        aws.ec2.Route(
            f"{name}-public-default",
            route_table_id=public_table.id,
            destination_cidr_block="0.0.0.0/0",
            gateway_id=gateway.id,
            opts=child,
        )
        zones = self._args.availability_zones
        self.public_subnet_ids = self._subnets(vpc, public_table, "public", zones)
        if not self._args.nat_egress:
            return
        address = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags=tags, opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=address.id,
            subnet_id=self.public_subnet_ids[0],
            tags={**tags, "Name": name},
            opts=child,
        )
        aws.ec2.Route(
            f"{name}-private-default",
            route_table_id=private_table.id,
            destination_cidr_block="0.0.0.0/0",
            nat_gateway_id=nat.id,
            opts=child,
        )
        self.nat_public_ip = address.public_ip

    def _endpoints(self, vpc: aws.ec2.Vpc, private_table: aws.ec2.RouteTable) -> None:
        """The S3 gateway endpoint and the interface endpoints, reachable over HTTPS only."""
        name, tags, child, invoke = self._resource_name, self._tags, self._child, self._invoke
        s3 = aws.ec2.get_vpc_endpoint_service_output(
            service="s3", service_type="Gateway", opts=invoke
        )
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=s3.service_name,
            vpc_endpoint_type="Gateway",
            route_table_ids=[private_table.id],
            tags={**tags, "Name": f"{name}-s3"},
            opts=child,
        )
        endpoint_group = aws.ec2.SecurityGroup(
            f"{name}-endpoints",
            vpc_id=vpc.id,
            description="HTTPS from inside the VPC to the AWS API endpoints",
            tags={**tags, "Name": f"{name}-endpoints"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-endpoints-https",
            security_group_id=endpoint_group.id,
            ip_protocol="tcp",
            from_port=HTTPS,
            to_port=HTTPS,
            cidr_ipv4=self._args.cidr,
            description="HTTPS from the VPC",
            opts=child,
        )
        for service in INTERFACE_ENDPOINTS:
            found = aws.ec2.get_vpc_endpoint_service_output(
                service=service, service_type="Interface", opts=invoke
            )
            label = service.replace(".", "-")
            aws.ec2.VpcEndpoint(
                f"{name}-{label}",
                vpc_id=vpc.id,
                service_name=found.service_name,
                vpc_endpoint_type="Interface",
                private_dns_enabled=True,
                subnet_ids=self.private_subnet_ids,
                security_group_ids=[endpoint_group.id],
                tags={**tags, "Name": f"{name}-{label}"},
                opts=child,
            )
