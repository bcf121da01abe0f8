{{/*
Generated from lensemble.config.rules (the registry of LensembleConfig's cross-field
rules) by `python -m tools.regenerate`: do not edit. Each check fails with the rule's
field path and message, the same a pod's config validation reports. The chart-only
checks on chart knobs are lensemble.validate in _helpers.tpl.
*/}}
{{- define "lensemble.configRules" -}}
{{- $c := .Values.config -}}
{{- $n := float64 (len $c.federation.participants) -}}
{{- /* held: Python's round(episodes * holdout_fraction), halves to the even neighbour. */ -}}
{{- $episodes := float64 $c.data.episodes -}}
{{- $x := mulf $episodes (float64 $c.data.holdout_fraction) -}}
{{- $held := floor $x -}}
{{- $rest := subf $x $held -}}
{{- if or (gt $rest 0.5) (and (eq $rest 0.5) (eq (mod (int $held) 2) 1)) -}}
{{- $held = addf $held 1.0 -}}
{{- end -}}
{{- $train := subf $episodes $held -}}
{{- $gpus := float64 $c.deployment.resources.participant.gpu -}}
{{- $cuda := regexMatch "(^|[-_.])cu[0-9]{3}([-_.]|$)" $c.deployment.image.tag -}}
{{- $domain_set := list -}}
{{- range $c.federation.participants -}}
{{- $domain_set = append $domain_set .trust_domain -}}
{{- end -}}
{{- $domain_set = $domain_set | uniq | sortAlpha -}}
{{- $domains := join ", " $domain_set -}}
{{- $half := floor (divf $n 2.0) -}}
{{- $masking := $c.federation.masking | default dict -}}
{{- $threshold := addf (floor (divf (mulf 2.0 $n) 3.0)) 1.0 -}}
{{- if not (kindIs "invalid" $masking.threshold) -}}
{{- $threshold = float64 $masking.threshold -}}
{{- end -}}
{{- /* widest_bits: the largest f in 0..62 with n * ceil(clip * 2**f) <= 2**63 - 1, else -1,
  exactly: ceil(clip * 2**f) is an integer below 2**63 and at most (2**63 - 1) // n in int64. */ -}}
{{- $limit := div 9223372036854775807 (int (maxf $n 1.0)) -}}
{{- $widest_bits := -1.0 -}}
{{- $scale := 1.0 -}}
{{- range $bits := until 63 -}}
{{- $bound := ceil (mulf (float64 $masking.clip) $scale) -}}
{{- if and (lt $bound 9.223372036854776e+18) (le (int64 $bound) $limit) -}}
{{- $widest_bits = float64 $bits -}}
{{- end -}}
{{- $scale = mulf $scale 2.0 -}}
{{- end -}}
{{- $first_ids := dict -}}
{{- $owners := dict -}}
{{- $physics := dict -}}
{{- $_ := set $physics "Pendulum-v1" (dict
  "g" (dict "minimum" 0.0 "default" 10.0)
  "m" (dict "minimum" 0.0 "default" 1.0)
  "l" (dict "minimum" 0.0 "default" 1.0)) -}}
{{- $_ := set $physics "MountainCarContinuous-v0" (dict
  "power" (dict "minimum" 0.0 "default" 0.0015)) -}}
{{- $_ := set $physics "CartPole-v1" (dict
  "gravity" (dict "minimum" 0.0 "default" 9.8)
  "masscart" (dict "minimum" 0.0 "default" 1.0)
  "masspole" (dict "minimum" 0.0 "default" 0.1)
  "length" (dict "minimum" 0.0 "default" 0.5)
  "force_mag" (dict "minimum" 0.0 "default" 10.0)) -}}
{{- $known := get $physics $c.data.env_id -}}
{{- range $i, $p := $c.federation.participants -}}
{{- $first_id := -1 -}}
{{- if hasKey $first_ids $p.id -}}{{- $first_id = get $first_ids $p.id -}}{{- end -}}
{{- $owner := "" -}}
{{- if hasKey $owners $p.trust_domain -}}{{- $owner = get $owners $p.trust_domain -}}{{- end -}}
{{- /* reserved-participant-id */ -}}
{{- if (has $p.id (list "all" "coordinator" "participant" "participants")) -}}
{{- fail (printf "config.federation.participants[%v].id: '%v' is a reserved role name (all, coordinator, participant, participants) and would share certificates and names with that role; choose another id." $i $p.id) -}}
{{- end -}}
{{- /* unique-participant-id */ -}}
{{- if (not (lt (float64 $first_id) 0.0)) -}}
{{- fail (printf "config.federation.participants[%v].id: '%v' is already used by participants[%v]; give every participant a unique id." $i $p.id $first_id) -}}
{{- end -}}
{{- /* privacy-delta-below-records */ -}}
{{- if (and (not (kindIs "invalid" $p.privacy)) (not (lt (float64 (mulf $p.privacy.delta $train)) 1.0))) -}}
{{- fail (printf "config.federation.participants[%v].privacy.delta: %v is not below 1 / %v (the participant's training episodes): a delta that large allows releasing a whole record; lower it (1e-5 is usual)." $i $p.privacy.delta $train) -}}
{{- end -}}
{{- /* privacy-one-rank */ -}}
{{- if (and (not (kindIs "invalid" $p.privacy)) (not (and (kindIs "invalid" $p.ranks) (eq (float64 $c.federation.ranks.nodes) 1.0) (eq (float64 $c.federation.ranks.processes_per_node) 1.0)))) -}}
{{- fail (printf "config.federation.participants[%v].privacy: differential privacy runs on a participant of one rank so far; remove the participant's ranks and keep federation.ranks at one node and one process, or set privacy: null." $i) -}}
{{- end -}}
{{- /* privacy-needs-its-own-key */ -}}
{{- if (and (not (kindIs "invalid" $p.privacy)) (not (or (eq $c.federation.transport "in_process") $c.network.tls.enabled))) -}}
{{- fail (printf "config.federation.participants[%v].privacy: over the network a participant seeds its differential-privacy noise from its own TLS key, so it needs network.tls.enabled: true (or privacy: null)." $i) -}}
{{- end -}}
{{- /* sovereign-own-trust-domain */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (not (eq $owner ""))) -}}
{{- fail (printf "config.federation.participants[%v].trust_domain: '%v' is shared with participant '%v'; give every participant its own trust domain in sovereign-prod." $i $p.trust_domain $owner) -}}
{{- end -}}
{{- /* sovereign-region */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (kindIs "invalid" $p.region)) -}}
{{- fail (printf "config.federation.participants[%v].region: is missing for participant '%v'; sovereign-prod pins every participant to an explicit region, e.g. region: eu-central-1." $i $p.id) -}}
{{- end -}}
{{- if $known -}}
{{- $names := keys $known | sortAlpha | join ", " -}}
{{- range $key, $value := $p.env_params -}}
{{- $spec := get $known $key -}}
{{- $known_key := not (empty $spec) -}}
{{- $minimum := 0.0 -}}
{{- $default := 0.0 -}}
{{- if $known_key -}}{{- $minimum = $spec.minimum -}}{{- $default = $spec.default -}}{{- end -}}
{{- /* known-physics-parameter */ -}}
{{- if (not $known_key) -}}
{{- fail (printf "config.federation.participants[%v].env_params.%v: '%v' is not a physics parameter of %v; use one of %v." $i $key $key $c.data.env_id $names) -}}
{{- end -}}
{{- /* usable-physics-value */ -}}
{{- if (and $known_key (not (gt (float64 $value) (float64 $minimum)))) -}}
{{- fail (printf "config.federation.participants[%v].env_params.%v: %v is not a usable value; use a finite number above %v (default %v)." $i $key $value $minimum $default) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not (hasKey $first_ids $p.id) -}}{{- $_ := set $first_ids $p.id $i -}}{{- end -}}
{{- if not (hasKey $owners $p.trust_domain) -}}
{{- $_ := set $owners $p.trust_domain $p.id -}}
{{- end -}}
{{- end -}}
{{- /* central-privacy-noise-or-budget */ -}}
{{- if (and (not (kindIs "invalid" $c.federation.central_privacy)) (not (or (not (kindIs "invalid" $c.federation.central_privacy.noise_multiplier)) (not (kindIs "invalid" $c.federation.central_privacy.epsilon))))) -}}
{{- fail (printf "config.federation.central_privacy: neither noise_multiplier nor epsilon is set; set noise_multiplier (the noise as a multiple of clip_norm), epsilon (the budget it is derived from), or both.") -}}
{{- end -}}
{{- /* central-privacy-mean */ -}}
{{- if (and (not (kindIs "invalid" $c.federation.central_privacy)) (not (eq $c.federation.robustness.aggregator "mean"))) -}}
{{- fail (printf "config.federation.robustness.aggregator: '%v' has no bounded sensitivity to one participant, so central differential privacy cannot account for it; set federation.robustness.aggregator: mean or central_privacy: null." $c.federation.robustness.aggregator) -}}
{{- end -}}
{{- /* central-privacy-fixed-bound */ -}}
{{- if (and (and (not (kindIs "invalid" $c.federation.central_privacy)) (eq $c.federation.aggregation "plain")) (not (or (kindIs "invalid" $c.federation.robustness.median_factor) (eq $c.federation.robustness.norm_bound_mode "off")))) -}}
{{- fail (printf "config.federation.robustness.median_factor: a norm bound scaled by the round's median norm lets one participant change how much the others are clipped, which central differential privacy cannot account for; set federation.robustness.median_factor: null (central_privacy.clip_norm bounds every update) or central_privacy: null.") -}}
{{- end -}}
{{- /* central-privacy-needs-its-own-key */ -}}
{{- if (and (not (kindIs "invalid" $c.federation.central_privacy)) (not (or (eq $c.federation.transport "in_process") (ne $c.federation.aggregation "plain") $c.network.tls.enabled))) -}}
{{- fail (printf "config.federation.central_privacy: over the network the coordinator seeds its central differential-privacy noise from its own TLS key, so it needs network.tls.enabled: true (or central_privacy: null).") -}}
{{- end -}}
{{- /* central-privacy-aggregation */ -}}
{{- if (and (not (kindIs "invalid" $c.federation.central_privacy)) (not (has $c.federation.aggregation (list "plain" "masking")))) -}}
{{- fail (printf "config.federation.central_privacy: '%v' cannot carry central differential privacy; set federation.aggregation: plain (the coordinator adds the noise) or masking (each participant adds its share), or central_privacy: null." $c.federation.aggregation) -}}
{{- end -}}
{{- /* quorum-within-participants */ -}}
{{- if (not (and (le 1.0 (float64 $c.federation.quorum)) (le (float64 $c.federation.quorum) (float64 $n)))) -}}
{{- fail (printf "config.federation.quorum: %v is outside 1..%v (the number of participants); set federation.quorum between 1 and %v." $c.federation.quorum $n $n) -}}
{{- end -}}
{{- /* supported-aggregation */ -}}
{{- if (has $c.federation.aggregation (list "tee")) -}}
{{- fail (printf "config.federation.aggregation: '%v' is not yet supported; use 'plain' or 'masking' (aggregation in a trusted execution environment is reserved for a later release)." $c.federation.aggregation) -}}
{{- end -}}
{{- /* overlap-needs-plain-aggregation */ -}}
{{- if (and (eq $c.federation.overlap.mode "one_round") (not (eq $c.federation.aggregation "plain"))) -}}
{{- fail (printf "config.federation.overlap.mode: 'one_round' is not built for aggregation '%v' yet; set federation.overlap.mode: blocking or federation.aggregation: plain." $c.federation.aggregation) -}}
{{- end -}}
{{- /* overlap-without-outer-momentum */ -}}
{{- if (and (eq $c.federation.overlap.mode "one_round") (not (eq (float64 $c.federation.outer_optimizer.momentum) 0.0))) -}}
{{- fail (printf "config.federation.outer_optimizer.momentum: %v with federation.overlap.mode one_round: outer momentum on a base one round old ended worse than momentum 0 in every run measured (1.01-1.9x the error, docs/performance.md); set federation.outer_optimizer.momentum: 0." $c.federation.outer_optimizer.momentum) -}}
{{- end -}}
{{- /* lr-hold-without-half-life */ -}}
{{- if (and (not (kindIs "invalid" $c.federation.outer_optimizer.lr_hold_rounds)) (kindIs "invalid" $c.federation.outer_optimizer.lr_half_life_rounds)) -}}
{{- fail (printf "config.federation.outer_optimizer.lr_hold_rounds: %v holds the outer learning rate before a decay that is not set; set federation.outer_optimizer.lr_half_life_rounds or remove lr_hold_rounds." $c.federation.outer_optimizer.lr_hold_rounds) -}}
{{- end -}}
{{- /* masking-threshold */ -}}
{{- if (and (and (eq $c.federation.aggregation "masking") (not (kindIs "invalid" $c.federation.masking.threshold))) (not (and (lt (float64 $half) (float64 $c.federation.masking.threshold)) (le (float64 $c.federation.masking.threshold) (float64 $n))))) -}}
{{- fail (printf "config.federation.masking.threshold: %v is not above half of the %v participants or exceeds them; set it above %v and at most %v, or null for the default floor(2n/3) + 1." $c.federation.masking.threshold $n $half $n) -}}
{{- end -}}
{{- /* masking-headroom */ -}}
{{- if (and (and (eq $c.federation.aggregation "masking") (not (kindIs "invalid" $c.federation.masking.fractional_bits))) (not (le (float64 $c.federation.masking.fractional_bits) (float64 $widest_bits)))) -}}
{{- fail (printf "config.federation.masking.fractional_bits: %v participants times clip %v times 2**%v exceeds 2**63 - 1, so the masked sum could overflow; use at most %v (or null for the widest that fits) or lower federation.masking.clip." $n $c.federation.masking.clip $c.federation.masking.fractional_bits $widest_bits) -}}
{{- end -}}
{{- /* masking-survivors */ -}}
{{- if (and (eq $c.federation.aggregation "masking") (not (le 3.0 (float64 $n)))) -}}
{{- fail (printf "config.federation.participants: %v participants are too few for masking: every masked sum needs at least 3 inputs (with two, each learns the other's update); use 3 or more participants or federation.aggregation: plain." $n) -}}
{{- end -}}
{{- /* masking-sends-fixed-point */ -}}
{{- if (and (eq $c.federation.aggregation "masking") (not (eq $c.federation.quantization "none"))) -}}
{{- fail (printf "config.federation.quantization: '%v' cannot be masked: the masked upload is 64-bit fixed point, never int8, bf16 or fp16; set federation.quantization: none or federation.aggregation: plain." $c.federation.quantization) -}}
{{- end -}}
{{- /* masking-needs-client-certificates */ -}}
{{- if (and (and (eq $c.federation.aggregation "masking") (eq $c.federation.transport "network")) (not (and (eq $c.network.tls.enabled true) (eq $c.network.tls.client_auth true)))) -}}
{{- fail (printf "config.network.tls.client_auth: masking over the network needs client certificates: every participant signs its secure-aggregation keys with the key of its client certificate, so set network.tls.enabled: true and network.tls.client_auth: true (network.auth: mtls), or federation.aggregation: plain.") -}}
{{- end -}}
{{- /* int8-chunk-needs-int8 */ -}}
{{- if (and (ne $c.federation.quantization "int8") (not (eq (float64 $c.federation.int8_chunk) 0.0))) -}}
{{- fail (printf "config.federation.int8_chunk: %v only applies to int8; set federation.quantization: int8 or federation.int8_chunk: 0." $c.federation.int8_chunk) -}}
{{- end -}}
{{- /* reject-needs-headroom */ -}}
{{- if (and (eq $c.federation.robustness.norm_bound_mode "reject") (not (or (kindIs "invalid" $c.federation.robustness.median_factor) (ge (float64 $c.federation.robustness.median_factor) 2.0)))) -}}
{{- fail (printf "config.federation.robustness.norm_bound_mode: 'reject' with median_factor %v leaves every update above that multiple of the median norm out of the round (about half of them at 1); set federation.robustness.median_factor to 2 or more, or use norm_bound_mode 'clip'." $c.federation.robustness.median_factor) -}}
{{- end -}}
{{- /* residency-over-network */ -}}
{{- if (and (eq $c.federation.transport "network") (not (eq $c.data.residency_enforced true))) -}}
{{- fail (printf "config.data.residency_enforced: false is not allowed with federation.transport 'network'; set data.residency_enforced: true.") -}}
{{- end -}}
{{- /* rpc-within-round */ -}}
{{- if (not (lt (float64 $c.network.rpc_timeout_s) (float64 $c.federation.round_timeout_s))) -}}
{{- fail (printf "config.network.rpc_timeout_s: %v s must be below federation.round_timeout_s (%v s) so a stuck RPC cannot outlive its round; lower it." $c.network.rpc_timeout_s $c.federation.round_timeout_s) -}}
{{- end -}}
{{- /* join-outlasts-round */ -}}
{{- if (not (ge (float64 $c.federation.join_timeout_s) (float64 $c.federation.round_timeout_s))) -}}
{{- fail (printf "config.federation.join_timeout_s: %v s must be at least federation.round_timeout_s (%v s); raise it." $c.federation.join_timeout_s $c.federation.round_timeout_s) -}}
{{- end -}}
{{- /* liveness-above-keepalive */ -}}
{{- if (not (lt (float64 $c.network.keepalive_s) (float64 $c.network.liveness_timeout_s))) -}}
{{- fail (printf "config.network.liveness_timeout_s: %v s must exceed network.keepalive_s (%v s), which leaves a ping no time to be answered; raise it or lower keepalive_s." $c.network.liveness_timeout_s $c.network.keepalive_s) -}}
{{- end -}}
{{- /* liveness-within-round */ -}}
{{- if (not (lt (float64 $c.network.liveness_timeout_s) (float64 $c.federation.round_timeout_s))) -}}
{{- fail (printf "config.network.liveness_timeout_s: %v s must be below federation.round_timeout_s (%v s) so that a frozen participant is noticed before its round times out; lower it." $c.network.liveness_timeout_s $c.federation.round_timeout_s) -}}
{{- end -}}
{{- /* backoff-within-join */ -}}
{{- if (not (le (float64 $c.network.connect_backoff_max_s) (float64 $c.federation.join_timeout_s))) -}}
{{- fail (printf "config.network.connect_backoff_max_s: %v s is longer than federation.join_timeout_s (%v s), so a participant waiting for the coordinator could sleep through the whole join window; lower it." $c.network.connect_backoff_max_s $c.federation.join_timeout_s) -}}
{{- end -}}
{{- /* holdout-leaves-both */ -}}
{{- if (not (and (ge (float64 $held) 1.0) (lt (float64 $held) (float64 $c.data.episodes)))) -}}
{{- fail (printf "config.data.holdout_fraction: %v of %v episodes leaves no train or no held-out episode; choose a fraction that keeps at least one of each." $c.data.holdout_fraction $c.data.episodes) -}}
{{- end -}}
{{- /* window-within-episode */ -}}
{{- if (not (lt (float64 $c.data.window) (float64 $c.data.episode_steps))) -}}
{{- fail (printf "config.data.window: %v must be below data.episode_steps (%v); lower it." $c.data.window $c.data.episode_steps) -}}
{{- end -}}
{{- /* k-steps-within-episode */ -}}
{{- if (not (lt (float64 $c.evaluation.k_steps) (float64 $c.data.episode_steps))) -}}
{{- fail (printf "config.evaluation.k_steps: %v must be below data.episode_steps (%v); lower it." $c.evaluation.k_steps $c.data.episode_steps) -}}
{{- end -}}
{{- /* distinct-ports */ -}}
{{- if (not (and (ne (float64 $c.network.port) (float64 $c.network.health_port)) (ne (float64 $c.network.port) (float64 $c.network.metrics_port)) (ne (float64 $c.network.health_port) (float64 $c.network.metrics_port)))) -}}
{{- fail (printf "config.network.metrics_port: network.port (%v), network.health_port (%v) and network.metrics_port (%v) must differ; give each its own port." $c.network.port $c.network.health_port $c.network.metrics_port) -}}
{{- end -}}
{{- /* distinct-download-port */ -}}
{{- if (and (not (kindIs "invalid" $c.network.download_port)) (has (float64 $c.network.download_port) (list (float64 $c.network.port) (float64 $c.network.health_port) (float64 $c.network.metrics_port)))) -}}
{{- fail (printf "config.network.download_port: %v is also network.port, health_port or metrics_port; give the model download its own port (or null to download over gRPC only)." $c.network.download_port) -}}
{{- end -}}
{{- /* tls-unless-insecure */ -}}
{{- if (and (and (eq $c.federation.transport "network") (ne $c.network.auth "insecure")) (not (eq $c.network.tls.enabled true))) -}}
{{- fail (printf "config.network.tls.enabled: false is not allowed with network.auth '%v'; enable TLS or set network.auth: insecure explicitly (never in sovereign-prod)." $c.network.auth) -}}
{{- end -}}
{{- /* tls-ca-file */ -}}
{{- if (and (and (eq $c.federation.transport "network") (eq $c.network.tls.enabled true)) (kindIs "invalid" $c.network.tls.ca_file)) -}}
{{- fail (printf "config.network.tls.ca_file: is required when TLS is on; point it at a PEM file (`lensemble certs init DIR --config FILE` creates a development set).") -}}
{{- end -}}
{{- /* tls-cert-file */ -}}
{{- if (and (and (eq $c.federation.transport "network") (eq $c.network.tls.enabled true)) (kindIs "invalid" $c.network.tls.cert_file)) -}}
{{- fail (printf "config.network.tls.cert_file: is required when TLS is on; point it at a PEM file (`lensemble certs init DIR --config FILE` creates a development set).") -}}
{{- end -}}
{{- /* tls-key-file */ -}}
{{- if (and (and (eq $c.federation.transport "network") (eq $c.network.tls.enabled true)) (kindIs "invalid" $c.network.tls.key_file)) -}}
{{- fail (printf "config.network.tls.key_file: is required when TLS is on; point it at a PEM file (`lensemble certs init DIR --config FILE` creates a development set).") -}}
{{- end -}}
{{- /* mtls-client-auth */ -}}
{{- if (and (and (eq $c.federation.transport "network") (eq $c.network.auth "mtls")) (not (eq $c.network.tls.client_auth true))) -}}
{{- fail (printf "config.network.tls.client_auth: false is not allowed with network.auth 'mtls'; set network.tls.client_auth: true.") -}}
{{- end -}}
{{- /* kueue-queue */ -}}
{{- if (and (eq $c.deployment.gang_scheduling.scheduler "kueue") (not (ne $c.deployment.gang_scheduling.queue ""))) -}}
{{- fail (printf "config.deployment.gang_scheduling.queue: kueue admits pods through a LocalQueue, but none is named; set deployment.gang_scheduling.queue (e.g. queue: lensemble).") -}}
{{- end -}}
{{- /* gpus-need-cuda */ -}}
{{- if (and (or (gt (float64 $c.deployment.resources.coordinator.gpu) 0.0) (gt (float64 $c.deployment.resources.participant.gpu) 0.0)) (not (regexMatch "(^|[-_.])cu[0-9]{3}([-_.]|$)" $c.deployment.image.tag))) -}}
{{- fail (printf "config.deployment.image.tag: '%v' is not a CUDA build but GPUs are requested; use a tag such as '0.1.0-cu126' or set the gpu counts to 0." $c.deployment.image.tag) -}}
{{- end -}}
{{- /* pinned-tag */ -}}
{{- if (and (ne $c.deployment.environment "local") (not (ne $c.deployment.image.tag "latest"))) -}}
{{- fail (printf "config.deployment.image.tag: '%v' is not allowed in %v; pin a version tag or a 'sha-<7 hex>' tag." $c.deployment.image.tag $c.deployment.environment) -}}
{{- end -}}
{{- /* sovereign-network */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (not (eq $c.federation.transport "network"))) -}}
{{- fail (printf "config.federation.transport: '%v' is not allowed in sovereign-prod; set it to 'network'." $c.federation.transport) -}}
{{- end -}}
{{- /* sovereign-mtls */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (not (eq $c.network.auth "mtls"))) -}}
{{- fail (printf "config.network.auth: '%v' is not allowed in sovereign-prod; set network.auth: mtls." $c.network.auth) -}}
{{- end -}}
{{- /* sovereign-confidential-compute */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (not (eq $c.deployment.confidential_compute true))) -}}
{{- fail (printf "config.deployment.confidential_compute: false is not allowed in sovereign-prod; set it to true.") -}}
{{- end -}}
{{- /* sovereign-namespaces */ -}}
{{- if (and (eq $c.deployment.environment "sovereign-prod") (not (eq $c.deployment.namespace.strategy "per-trust-domain"))) -}}
{{- fail (printf "config.deployment.namespace.strategy: '%v' is not allowed in sovereign-prod; use 'per-trust-domain'." $c.deployment.namespace.strategy) -}}
{{- end -}}
{{- $served := list -}}
{{- range $name := list "port" "health_port" "metrics_port" "download_port" -}}
{{- with get $c.network $name -}}
{{- $served = append $served (list (printf "network.%s" $name) .) -}}
{{- end -}}
{{- end -}}
{{- $layouts := list (dict "where" "federation.ranks" "who" "every participant"
  "l" $c.federation.ranks) -}}
{{- range $i, $p := $c.federation.participants -}}
{{- if $p.ranks -}}
{{- $own := dict -}}
{{- range $k, $v := $c.federation.ranks -}}{{- $_ := set $own $k $v -}}{{- end -}}
{{- range $k, $v := $p.ranks -}}
{{- if not (kindIs "invalid" $v) -}}{{- $_ := set $own $k $v -}}{{- end -}}
{{- end -}}
{{- $layouts = append $layouts (dict "where" (printf "federation.participants[%d].ranks" $i)
  "who" (printf "participant '%s'" $p.id) "l" $own) -}}
{{- end -}}
{{- end -}}
{{- range $layouts -}}
{{- $where := .where -}}
{{- $who := .who -}}
{{- $l := .l -}}
{{- $world := mulf (float64 $l.nodes) (float64 $l.processes_per_node) -}}
{{- $clash := "" -}}
{{- range $served -}}
{{- if and (not $clash) (eq (float64 (index . 1)) (float64 $l.rendezvous_port)) -}}
{{- $clash = index . 0 -}}
{{- end -}}
{{- end -}}
{{- /* ranks-within-episodes */ -}}
{{- if (not (le (float64 $world) (float64 (maxf (float64 $train) 1.0)))) -}}
{{- fail (printf "config.%v.processes_per_node: %v ranks for %v but only %v training episodes to shard among them; use at most %v ranks or raise data.episodes." $where $world $who $train $train) -}}
{{- end -}}
{{- /* nccl-needs-cuda */ -}}
{{- if (and (eq $l.backend "nccl") (not $cuda)) -}}
{{- fail (printf "config.%v.backend: 'nccl' for %v needs a CUDA image, but deployment.image.tag '%v' names none; use a '-cuNNN' tag or backend 'gloo'." $where $who $c.deployment.image.tag) -}}
{{- end -}}
{{- /* nccl-ranks-need-gpus */ -}}
{{- if (and (eq $l.backend "nccl") (not (ge (float64 $gpus) (float64 $l.processes_per_node)))) -}}
{{- fail (printf "config.%v.processes_per_node: %v nccl ranks per node for %v need as many GPUs, but deployment.resources.participant.gpu is %v; raise the gpu count or lower processes_per_node." $where $l.processes_per_node $who $gpus) -}}
{{- end -}}
{{- /* rendezvous-port-free */ -}}
{{- if (and (gt (float64 $l.nodes) 1.0) (not (eq $clash ""))) -}}
{{- fail (printf "config.%v.rendezvous_port: %v for %v is also %v, and both listen on the participant's host; choose another port (e.g. 29400)." $where $l.rendezvous_port $who $clash) -}}
{{- end -}}
{{- /* ranks-divide-batch */ -}}
{{- if (and (gt (float64 $world) 1.0) (not (eq (float64 (float64 (mod (int $c.federation.inner_optimizer.batch_size) (int $world)))) 0.0))) -}}
{{- fail (printf "config.%v.processes_per_node: %v ranks for %v cannot split federation.inner_optimizer.batch_size %v into equal shards; use a rank count that divides the batch size." $where $world $who $c.federation.inner_optimizer.batch_size) -}}
{{- end -}}
{{- /* ranks-without-ema */ -}}
{{- if (and (gt (float64 $world) 1.0) (not (ne $c.model.target "ema"))) -}}
{{- fail (printf "config.%v.processes_per_node: %v ranks for %v with model.target 'ema': the sharded inner loop keeps no EMA target yet; use model.target 'stop_gradient' or one rank." $where $world $who) -}}
{{- end -}}
{{- /* bf16-needs-nccl */ -}}
{{- if (and (eq $l.mixed_precision "bf16") (not (eq $l.backend "nccl"))) -}}
{{- fail (printf "config.%v.mixed_precision: 'bf16' for %v is GPU mixed precision and needs backend 'nccl'; use 'none' on CPU (or model.dtype: bfloat16)." $where $who) -}}
{{- end -}}
{{- end -}}
{{- range $key, $_ := $c.deployment.trust_domains -}}
{{- /* placement-of-a-trust-domain */ -}}
{{- if (not (has $key $domain_set)) -}}
{{- fail (printf "config.deployment.trust_domains.%v: '%v' is not the trust domain of any participant; use one of %v." $key $key $domains) -}}
{{- end -}}
{{- end -}}
{{- end -}}
