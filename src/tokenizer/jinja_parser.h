// Parser of the Jinja subset engine: tokens to a syntax tree, with jinja2's operator precedence.
#pragma once

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace strata::jinja {

// Throws Error("chat template syntax error at line L:C: ...") on a syntax error or a construct the engine lacks.
StmtList parse_template(const LexedTemplate& lexed);

}  // namespace strata::jinja
