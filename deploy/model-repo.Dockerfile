# A rendered model repository as an image, for the pods of deploy/k8s (`prensa deploy k8s
# --repo-image`): an init container copies /models into the pod before Triton starts. The build
# context is the repository itself, so nothing else is sent to the builder; hard-linked graph files
# are copied as regular files:
#   docker build -f deploy/model-repo.Dockerfile -t REGISTRY/prensa-model-repo:TAG model_repo
FROM busybox:1.36
COPY . /models
