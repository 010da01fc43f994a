// node-postgres 8.20 under an alias (devDependency `pg-8-20`), for tests of applications that pin
// an older pg: the same API as `pg`, minus what 8.21 added (Client#getTransactionStatus).
declare module 'pg-8-20' {
  import pg from 'pg';
  export default pg;
}
