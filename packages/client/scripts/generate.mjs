// Writes src/generated.ts from the repository's openapi.json (itself generated from the API's
// route table): each operation's method name (`x-rpc`), HTTP method, path, parameters and
// where its fields go, and TypeScript types for its fields and answers.
//
//   node scripts/generate.mjs           write it
//   node scripts/generate.mjs --check   fail when the committed file differs (the build runs this)
import fs from "node:fs";

const here = new URL("..", import.meta.url);
const doc = JSON.parse(fs.readFileSync(new URL("../../openapi.json", here), "utf8"));
const out = new URL("src/generated.ts", here);

// A JSON Schema (the subset the document uses) as a TypeScript type.
function type(s, depth = 0) {
  if (s.$ref) return named(s.$ref.split("/").pop());
  if (s.const !== undefined) return JSON.stringify(s.const);
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(" | ");
  const union = s.anyOf ?? s.oneOf;
  if (union) return union.map((m) => wrap(type(m, depth))).join(" | ");
  if (Array.isArray(s.type)) return s.type.map((t) => type({ ...s, type: t }, depth)).join(" | ");
  switch (s.type) {
    case "integer":
    case "number":
      return "number";
    case "string":
      return "string";
    case "boolean":
      return "boolean";
    case "null":
      return "null";
    case "array":
      return `${wrap(type(s.items ?? {}, depth))}[]`;
    case "object":
      return object(s, depth);
    default:
      return s.properties ? object(s, depth) : "unknown";
  }
}

function wrap(t) {
  return t.includes(" | ") ? `(${t})` : t;
}

function object(s, depth) {
  const props = Object.entries(s.properties ?? {});
  if (props.length === 0) {
    if (s.additionalProperties && typeof s.additionalProperties === "object") {
      return `{ [name: string]: ${type(s.additionalProperties, depth)} }`;
    }
    return s.additionalProperties === false ? "Record<string, never>" : "Record<string, unknown>";
  }
  const required = new Set(s.required ?? []);
  const pad = "  ".repeat(depth + 1);
  const fields = props.map(([k, v]) => {
    const doc = v.description ? `${pad}/** ${v.description} */\n` : "";
    return `${doc}${pad}${k}${required.has(k) ? "" : "?"}: ${type(v, depth + 1)};`;
  });
  return `{\n${fields.join("\n")}\n${"  ".repeat(depth)}}`;
}

// A component schema's type name (`Error` would hide the global one).
function named(component) {
  return component === "Error" ? "ErrorBody" : component;
}

function pascal(id) {
  return id[0].toUpperCase() + id.slice(1);
}

const lines = ["// Generated from openapi.json by scripts/generate.mjs: do not edit (the build checks it).", ""];
for (const [name, schema] of Object.entries(doc.components.schemas)) {
  lines.push(`/** ${schema.description ?? `The \`${name}\` schema of the API.`} */`);
  lines.push(`export type ${named(name)} = ${type(schema)};`, "");
}
lines.push(
  "/** Call options: an Idempotency-Key makes a write's retry answer what its first call answered. */",
  "export interface CallOptions {",
  "  idempotencyKey?: string;",
  "}",
  "",
  "/** The headers an answer came with (RateLimit-Policy, RateLimit, Retry-After, Idempotent-Replayed). */",
  "export type WithHeaders<T> = T & { headers?: { [name: string]: string } };",
  "",
);

const table = [];
const methods = [];
for (const [path, item] of Object.entries(doc.paths)) {
  for (const [verb, op] of Object.entries(item)) {
    const name = op["x-rpc"];
    if (!name) continue;
    const params = (op.parameters ?? []).filter((p) => p.in === "path").map((p) => p.name);
    const query = (op.parameters ?? []).filter((p) => p.in === "query");
    const id = op.operationId;
    let input;
    if (op.requestBody) {
      input = type(op.requestBody.content["application/json"].schema);
    } else {
      input = type({
        type: "object",
        properties: Object.fromEntries(query.map((q) => [q.name, q.schema])),
        additionalProperties: false,
      });
    }
    const answers = Object.entries(op.responses)
      .filter(([status]) => status.startsWith("2"))
      .map(([, r]) => type(r.content["application/json"].schema));
    lines.push(`/** The fields of \`${name}\`. */`, `export type ${pascal(id)}Input = ${input};`);
    lines.push(`/** What \`${name}\` answers. */`, `export type ${pascal(id)}Answer = ${[...new Set(answers)].join(" | ")};`, "");
    table.push(`  ${name}: { method: "${verb.toUpperCase()}", path: "${path}", params: ${JSON.stringify(params)}, query: ${query.length > 0 || verb === "get"} },`);
    const args = params.map((p) => `${p}: string`).concat([`input?: ${pascal(id)}Input`, "options?: CallOptions"]);
    methods.push(`  /** ${op.summary} \`${verb.toUpperCase()} ${path}\` */`);
    methods.push(`  ${name}(${args.join(", ")}): Promise<WithHeaders<${pascal(id)}Answer>>;`);
  }
}
lines.push(
  "/** Every method: its HTTP route, path parameters (the arguments before the fields) and whether its fields go in the query. */",
  "export const routes = {",
  ...table,
  "} as const;",
  "",
  "/** The method names. */",
  "export type MethodName = keyof typeof routes;",
  "",
  "/** The methods, as the binding and the HTTP API both answer them. */",
  "export interface Methods {",
  ...methods,
  "}",
  "",
);
const text = lines.join("\n");

if (process.argv.includes("--check")) {
  const committed = fs.existsSync(out) ? fs.readFileSync(out, "utf8") : "";
  if (committed !== text) {
    console.error("src/generated.ts is not what openapi.json generates: run `node scripts/generate.mjs` and commit it");
    process.exit(1);
  }
} else {
  fs.writeFileSync(out, text);
}
