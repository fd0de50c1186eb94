"""``omtr deploy``: roll the serving Deployment to a registered model version."""

from __future__ import annotations

from omtr.cli import CliError, add_command, read_input_file

EXAMPLES = """  omtr deploy                                              # the version @champion points at
  omtr deploy --version 3 --namespace omtr                 # a given version
  omtr deploy --version 3 --dry-run                        # print and validate the patch, change nothing
  omtr deploy --version 3 --dry-run --manifest serving.yaml  # no cluster: patch the Deployment in a file
  omtr deploy --version 2 --timeout 300                    # roll back by hand to version 2

The patch sets the container's MODEL_URI to models:/NAME/VERSION and the pod-template annotation
omtr.dev/model-version; the patched Deployment is validated against the Kubernetes 1.31 schemas
(kubernetes-validate, strict) before it is sent. The rollout is then watched (updated and
available replicas, ProgressDeadlineExceeded) until --timeout; if it fails, the previous MODEL_URI
and annotation are patched back and the exit status is 1.
Cluster access: in a pod, its ServiceAccount (get/patch on deployments); else $KUBECONFIG or
~/.kube/config (--kubeconfig, --context). Registry: $MLFLOW_TRACKING_URI, else ./mlruns.db.
Exit status: 0 rolled out (or nothing to do, or a dry run), 1 the rollout failed, 2 usage errors.
"""


def register(sub) -> None:
    p = add_command(
        sub, "deploy",
        help="roll the serving Deployment to a registered model version (default: @champion)",
        description=("Patch the serving Deployment's MODEL_URI and model-version annotation to a registered "
                     "version, wait for the rollout with a time-out, and roll back if it fails."),
        examples=EXAMPLES,
    )
    p.add_argument("--name", default="omtr-role-model", help="registered model name (default omtr-role-model)")
    p.add_argument("--version", help="the version to serve (default: the one the alias points at)")
    p.add_argument("--alias", default="champion", help="alias to resolve when --version is not given (default champion)")
    p.add_argument("--namespace", default="omtr", help="namespace of the serving Deployment (default omtr)")
    p.add_argument("--deployment", default="omtr-serving", help="the serving Deployment (default omtr-serving)")
    p.add_argument("--container", default="serving", help="its container that serves the model (default serving)")
    p.add_argument("--timeout", type=float, default=600, metavar="S", help="seconds to wait for the rollout (default 600)")
    p.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between status reads (default 2)")
    p.add_argument("--dry-run", action="store_true", help="print and validate the patch; change nothing")
    p.add_argument("--manifest", metavar="FILE", help="with --dry-run: read the Deployment from this YAML file, not the cluster")
    p.add_argument("--no-registry-check", action="store_true",
                   help="trust --version without looking it up in the MLflow registry")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--kubernetes-version", default=None, metavar="X.Y",
                   help="schemas to validate the patched Deployment against (default 1.31)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON here")
    p.set_defaults(handler=run)


def apps_api(kubeconfig: str | None, context: str | None):
    """An AppsV1Api from the pod's ServiceAccount or a kubeconfig; CliError when neither exists."""
    import os

    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError) as exc:
        raise CliError(f"no Kubernetes configuration ({exc}): run inside the cluster, set KUBECONFIG, "
                       f"pass --kubeconfig, or use --dry-run --manifest FILE") from None
    return client.AppsV1Api()


def run(args) -> int:
    import json

    from omtr.k8s import deploy as d

    if args.manifest and not args.dry_run:
        raise CliError("--manifest stands in for the cluster only in a dry run: add --dry-run")
    if args.timeout <= 0 or args.poll <= 0:
        raise CliError("--timeout and --poll must be positive seconds")
    target = d.Target(args.namespace, args.deployment, args.container)
    try:
        if args.version and args.no_registry_check:
            version = str(args.version)
        else:
            version = d.resolve_version(args.name, args.version, args.alias)
        manifest = None
        if args.manifest:
            manifest = d.deployment_from_manifest(read_input_file(args.manifest, "--manifest").decode(), target)
        apps = None if manifest is not None else apps_api(args.kubeconfig, args.context)
        res = d.deploy(apps, target, args.name, version, timeout_s=args.timeout, poll_s=args.poll,
                       dry_run=args.dry_run, manifest=manifest,
                       k8s_version=args.kubernetes_version or d.KUBERNETES_VERSION)
    except d.RolloutFailed as exc:
        print(f"omtr deploy: {exc}")
        return 1
    except d.DeployError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res.to_dict(), fh, indent=2)
            fh.write("\n")
    print(d.summary(res))
    return 0
