# The container image and docker-compose.yml, built and run by a private dockerd (label `docker`,
# tests/docker/docker_stage): needs root, docker.io and debootstrap (scripts/install-deps) and
# builds nothing of this tree. scripts/test runs it in a stage of its own (`docker`); the
# daemon's state (base image, layer cache) stays in the build tree's docker/ directory.
add_test(NAME docker_stage
         COMMAND ${PROJECT_SOURCE_DIR}/tests/docker/docker_stage ${PROJECT_BINARY_DIR}/docker)
set_tests_properties(docker_stage PROPERTIES LABELS docker TIMEOUT 2400 RUN_SERIAL TRUE)
