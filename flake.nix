{
  description = "specdeploy: reproducible LLM serving with speculative decoding (vLLM DFlash, SGLang MTP)";

  # Pinned in flake.lock by rev and narHash; the lock's values are those published in
  # numtide/treefmt-nix's flake.lock at commit 002612d0304eae829499ca9ba2c881ca06aa0611.
  inputs.nixpkgs.url = "github:nixos/nixpkgs/nixpkgs-unstable";

  outputs = { self, nixpkgs }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f system nixpkgs.legacyPackages.${system});
      runtimeDeps = ps: with ps; [
        click
        filelock
        ftfy
        httpx
        huggingface-hub
        numpy
        packaging
        prometheus-client
        pydantic
        pyyaml
        rich
        typer
        wordfreq
      ];
    in
    {
      # The CLI, built from pyproject.toml. nixpkgs brings its own tested versions of the
      # dependencies, not locks/host-cli.txt's (docs/locks-and-nix.md "Nix" lists them); the hash locks apply to venv installs.
      packages = forAllSystems (system: pkgs: {
        default = pkgs.python3Packages.buildPythonApplication {
          pname = "specdeploy";
          version = "0.1.0";
          pyproject = true;
          src = ./.;
          build-system = [ pkgs.python3Packages.hatchling ];
          dependencies = runtimeDeps pkgs.python3Packages;
          pythonRelaxDeps = true;
          nativeCheckInputs = [ pkgs.python3Packages.pytestCheckHook ];
          # The unit tests that need neither the rehearsal engine nor system files.
          enabledTestPaths = [
            "tests/unit/test_profile.py"
            "tests/unit/test_lock.py"
            "tests/unit/test_acceptance.py"
            "tests/unit/test_smoke_sglang.py"
          ];
          meta.mainProgram = "specdeploy";
        };
      });

      # nix run .#smoke-test -- --endpoint URL --profile NAME
      apps = forAllSystems (system: pkgs:
        let cli = self.packages.${system}.default; in {
          smoke-test = {
            type = "app";
            program = "${pkgs.writeShellScript "specdeploy-smoke-test" ''
              exec ${cli}/bin/specdeploy smoke "$@"
            ''}";
          };
          default = {
            type = "app";
            program = "${cli}/bin/specdeploy";
          };
        });

      devShells = forAllSystems (system: pkgs: {
        default = pkgs.mkShell {
          packages = [
            (pkgs.python3.withPackages (ps: runtimeDeps ps ++ [ ps.pytest ps.dockerfile-parse ]))
            pkgs.ansible
            pkgs.ansible-lint
            pkgs.hadolint
            pkgs.podman
            pkgs.ruff
          ];
        };
      });

      # Building the package runs its unit tests (pytestCheckHook).
      checks = forAllSystems (system: pkgs: {
        unit = self.packages.${system}.default;
      });
    };
}
