"""``alertmanager.yml``: pages and tickets to their webhooks, grouped by workload and slice; info goes nowhere.

Only tpuscope's alerts are routed (:data:`OURS`), so an Alertmanager shared with other teams routes theirs as before;
the inhibit rules keep an incident's symptoms quiet while the alert that names its cause fires
(:data:`tpuscope.alerts.causes.INHIBITIONS`).
"""

from __future__ import annotations

from tpuscope.alerts.causes import INHIBITIONS, SAME_WORKLOAD
from tpuscope.alerts.rule_file import HEADER, dump
from tpuscope.conventions import ALERT_PREFIX, OUR_ALERTS, AlertName
from tpuscope.generator_config import GeneratorConfig

PAGE, TICKET, NOWHERE = "page", "ticket", "null"
OURS = f'alertname=~"{OUR_ALERTS}"'


def render(config: GeneratorConfig) -> str:
    """The Alertmanager configuration, to the webhooks of ``config``."""
    document = {
        "route": {
            "receiver": NOWHERE,
            # Per-workload alerts have no instance, per-host ones no workload, per-job ones (sidecars down)
            # neither, per-node ones (a suspect node) only the node: each groups by what it has.
            "group_by": ["alertname", "workload", "slice", "instance", "namespace", "jobset", "node"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {"matchers": [OURS, 'severity="critical"'], "receiver": PAGE, "repeat_interval": "1h"},
                {"matchers": [OURS, 'severity="warning"'], "receiver": TICKET, "repeat_interval": "1d"},
            ],
        },
        "receivers": [
            {"name": NOWHERE},
            {"name": PAGE, "webhook_configs": [{"url": config.page_webhook_url, "send_resolved": True}]},
            {"name": TICKET, "webhook_configs": [{"url": config.ticket_webhook_url, "send_resolved": True}]},
        ],
        "inhibit_rules": [
            {  # the page says it already (a fast burn is a slow one too)
                "source_matchers": [OURS, 'severity="critical"'],
                "target_matchers": [OURS, 'severity="warning"'],
                "equal": ["alertname", *SAME_WORKLOAD],
            },
            *(
                {
                    "source_matchers": [_one_of(rule.source)],
                    "target_matchers": [_one_of(rule.targets), *([rule.only] if rule.only else [])],
                    "equal": list(SAME_WORKLOAD),
                }
                for rule in INHIBITIONS
            ),
        ],
    }
    return HEADER + dump(document)


def _one_of(names: tuple[AlertName, ...]) -> str:
    """A matcher of these alerts, the prefix said once."""
    if len(names) == 1:
        return f'alertname="{names[0]}"'
    return f'alertname=~"{ALERT_PREFIX}({"|".join(name.removeprefix(ALERT_PREFIX) for name in names)})"'
