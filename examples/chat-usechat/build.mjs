// Builds the page into dist/ (or the folder given as the first argument):
// src/main.jsx bundled with esbuild, with index.html and app.css beside it.
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";

const out = process.argv[2] || "dist";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["src/main.jsx"],
  bundle: true,
  format: "esm",
  jsx: "automatic",
  minify: true,
  sourcemap: true,
  define: { "process.env.NODE_ENV": '"production"' },
  outfile: join(out, "app.js"),
  logLevel: "warning",
});
for (const f of ["index.html", "app.css"]) copyFileSync(join("src", f), join(out, f));
