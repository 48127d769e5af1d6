-- Who deployed each stored version (`MachineRecord::origin`): `settle` marks the versions of
-- its built-in machines `built-in`, so that an operator sees them and the binary never
-- merges them into a deployment of other definitions. Versions stored before: unknown ('').
ALTER TABLE machines ADD COLUMN origin TEXT NOT NULL DEFAULT '';
