#!/usr/bin/env bash
# Builds Needle.dll, Example.exe and Tests.exe with mono's mcs into $OUT (default ./bin).
# Run them with the library on the loader path:  LD_LIBRARY_PATH=<libdir> mono bin/Tests.exe
set -euo pipefail
cd "$(dirname "$0")"
out="${OUT:-bin}"
mkdir -p "$out"
mcs -nologo -warnaserror -target:library -out:"$out/Needle.dll" Needle.cs Chat.cs
# The statically linked variant (imports "__Internal", for iOS AOT builds); Tests.exe inspects it.
mcs -nologo -warnaserror -target:library -define:NEEDLE_STATIC -out:"$out/NeedleStatic.dll" Needle.cs Chat.cs
mcs -nologo -warnaserror -r:"$out/Needle.dll" -out:"$out/Example.exe" Example.cs
mcs -nologo -warnaserror -r:"$out/Needle.dll" -r:System.Core.dll -out:"$out/Tests.exe" Tests.cs
